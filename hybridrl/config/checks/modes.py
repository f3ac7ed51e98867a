"""Checks of trainer.mode (one_step_off / async, docs: hybridrl/trainer/async_rollout.py), of partial
rollouts, the weight swaps into a running generation that those modes allow, and of the split those
modes run on when resource_pool.rollout=auto (hybridrl/trainer/calibration.py)."""

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


def auto_split_problems(cfg: Config) -> list[Problem]:
    """resource_pool.rollout=auto: the split of a node's devices between the actor and the rollout pool,
    chosen after calibration steps (trainer/calibration.py)."""
    t, pool, key = cfg.trainer, cfg.resource_pool, "resource_pool.rollout"
    if t.mode == "sync":
        return [
            Problem(
                f"{key}=auto chooses devices for rollouts that run while the actor trains, which trainer.mode=sync never "
                "does; use trainer.mode=one_step_off (or async)",
                ("trainer.mode", key),
                {"trainer.mode": "one_step_off"},
            )
        ]
    if t.n_gpus_per_node < 2:
        return [
            suggest(
                key, "auto", f"needs two or more devices per node to split, and trainer.n_gpus_per_node={t.n_gpus_per_node}", None
            )
        ]
    for other in ("actor_rollout_ref", "critic", "reward_model"):
        if getattr(pool, other) is not None:
            return [
                Problem(
                    f"{key}=auto splits all of a node's devices between the actor (with a colocated critic and reward "
                    f"model) and the rollout pool, so resource_pool.{other} must be null; use "
                    f"resource_pool.{other}=null, or a fixed {key}",
                    (f"resource_pool.{other}", key),
                    {f"resource_pool.{other}": None},
                )
            ]
    return []
