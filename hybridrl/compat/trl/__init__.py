"""TRL's vocabulary for the Python API (docs/coming_from_trl.md): GRPOConfig's names (`settings`), a
GRPOTrainer call's shape (`call`: positional order, `args=GRPOConfig(...)`), reward functions and rows
(`rewards`), and transformers' callbacks, refused at the start (`callbacks`)."""

from .call import Call, read_call
from .callbacks import check_callbacks
from .rewards import adapt_reward
from .settings import TRL_ALIASES, TRL_NO_EFFECT, TRL_REFUSED, translate

__all__ = ["TRL_ALIASES", "TRL_NO_EFFECT", "TRL_REFUSED", "Call", "adapt_reward", "check_callbacks", "read_call", "translate"]
