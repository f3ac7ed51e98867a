"""Checks of trainer.mode (one_step_off / async, docs: hybridrl/trainer/async_rollout.py) and of partial
rollouts, the weight swaps into a running generation that those modes allow."""

from ..problem import Problem, suggest
from ..schema import Config


def async_problems(cfg: Config) -> list[Problem]:
    """trainer.mode one_step_off / async: the RL loop only, and a loss that corrects the staleness."""
    t, rc = cfg.trainer, cfg.algorithm.rollout_correction
    if t.mode == "sync":
        return []
    out = []
    if cfg.algorithm.name != "rl":
        out.append(suggest("trainer.mode", t.mode, f"runs the RL loop only (algorithm.name={cfg.algorithm.name})", "sync"))
    if rc.bypass_mode:
        out.append(
            Problem(
                f"trainer.mode={t.mode} trains on samples of older policies, which rollout_correction.bypass_mode=true would "
                "take as on-policy; use algorithm.rollout_correction.bypass_mode=false",
                ("algorithm.rollout_correction.bypass_mode", "trainer.mode"),
                {"algorithm.rollout_correction.bypass_mode": False},
            )
        )
    if cfg.algorithm.filter_groups.enable:
        out.append(
            Problem(
                f"trainer.mode={t.mode} with DAPO dynamic sampling (algorithm.filter_groups.enable) is not supported: a "
                "step's extra generation rounds would run on the trainer's critical path; use trainer.mode=sync",
                ("trainer.mode", "algorithm.filter_groups.enable"),
                {"trainer.mode": "sync"},
            )
        )
    return out


def partial_rollout_problems(cfg: Config) -> list[Problem]:
    """async_training.partial_rollout: weights swapped into a running generation on the rollout pool."""
    if not cfg.async_training.partial_rollout:
        return []
    key, r = "async_training.partial_rollout", cfg.actor_rollout_ref.rollout
    why = None
    if not cfg.resource_pool.rollout:
        why = "needs a rollout pool of its own (resource_pool.rollout): a colocated engine never runs during an update"
    elif cfg.trainer.mode == "sync":
        why = "needs trainer.mode one_step_off or async (in sync mode no update happens while the pool generates)"
    elif r.multi_turn.enable:
        why = "is single-turn only (rollout.multi_turn.enable=true)"
    elif r.name == "hf" or (r.name == "auto" and cfg.trainer.device == "cpu") or r.name == "vllm":
        why = f"needs the native engine (rollout.name={r.name}); set actor_rollout_ref.rollout.name=native"
    return [] if why is None else [suggest(key, True, why, False)]
