"""hybridrl: RL post-training for LLMs, one controller, many SPMD workers."""

__version__ = "0.1.0"


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
