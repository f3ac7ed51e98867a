"""Rule-based rewards: plain ``score(response, ground_truth) -> float`` functions,
the dispatch on ``data_source``, user-supplied reward files, and batch scoring."""

from .custom import load_custom_reward_fn
from .manager import ScoreResult, score_batch
from .registry import KNOWN_DATA_SOURCES, check_reward_kwargs, default_compute_score, needs_ground_truth

__all__ = [
    "KNOWN_DATA_SOURCES",
    "ScoreResult",
    "check_reward_kwargs",
    "default_compute_score",
    "load_custom_reward_fn",
    "needs_ground_truth",
    "score_batch",
]
