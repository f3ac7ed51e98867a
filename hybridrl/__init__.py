"""hybridrl: RL post-training for LLMs, one controller, many SPMD workers."""

__version__ = "0.1.0"

# The Python API (docs/api.md). hybridrl.api imports only the stdlib at the top, so `import hybridrl`
# stays light (the CLI's report and dashboard never import torch).
from hybridrl.api import FitResult, HybridRLError, RLTrainer, TrainingStopped, batched_reward, grpo, ppo  # noqa: E402

__all__ = [
    "EarlyStopping",
    "FitResult",
    "HybridRLError",
    "RLTrainer",
    "RemoteReward",
    "TrainingStopped",
    "batched_reward",
    "grpo",
    "ppo",
]


def __getattr__(name):
    if name == "RemoteReward":  # hybridrl.rewards imports numpy and the scorers: only when asked for
        from hybridrl.rewards.remote import RemoteReward

        return RemoteReward
    if name == "EarlyStopping":  # a callback of the Python API (hybridrl/trainer/callbacks.py)
        from hybridrl.trainer.callbacks import EarlyStopping

        return EarlyStopping
    raise AttributeError(f"module 'hybridrl' has no attribute {name!r}")


def _wire_registries() -> None:
    """Config checks, `explain` and docs/config.md take the allowed estimator and policy-loss names
    from the registries in hybridrl.algorithms (built-ins plus what `extensions` registered). The
    config layer imports nothing above it, so the package hands the registries in here; torch is
    imported only when a config is first checked."""
    from hybridrl.config.extensions import use_registry

    def estimators():
        from hybridrl.algorithms import ADV_ESTIMATORS

        return ADV_ESTIMATORS

    def policy_losses():
        from hybridrl.algorithms import POLICY_LOSSES

        return POLICY_LOSSES

    use_registry("algorithm.adv_estimator", estimators)
    use_registry("actor_rollout_ref.actor.policy_loss.loss_mode", policy_losses)


_wire_registries()
