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
    from the registries in hybridrl.algorithms (built-ins plus what `extensions` registered), apply a
    few rules that live with rollout and models, and read every config in verl's dialect (its keys,
    Hydra files and command lines: hybridrl/compat/verl). The config layer imports nothing above it,
    so the package hands all three in here; torch is imported only when a config is first checked,
    the wing when a config is first read."""
    from hybridrl.config.dialect import use_dialect
    from hybridrl.config.extensions import use_registry, use_rule

    def verl_dialect():
        from hybridrl.compat.verl.dialect import VerlDialect

        return VerlDialect()

    def estimators():
        from hybridrl.algorithms import ADV_ESTIMATORS

        return ADV_ESTIMATORS

    def policy_losses():
        from hybridrl.algorithms import POLICY_LOSSES

        return POLICY_LOSSES

    use_registry("algorithm.adv_estimator", estimators)
    use_registry("actor_rollout_ref.actor.policy_loss.loss_mode", policy_losses)
    use_dialect(verl_dialect)
    # The features' own rules the checks apply (config/extensions.py `use_rule`), imported on first use.
    use_rule("forced_response_lengths", "hybridrl.rollout.lengths:from_config")
    use_rule("tp_shards", "hybridrl.models.tp_shards:check_tp")
    use_rule("tool_config", "hybridrl.rollout.agent.tool_config:load_tool_config")
    use_rule("interaction_config", "hybridrl.rollout.agent.interaction:load_interaction_config")


_wire_registries()
