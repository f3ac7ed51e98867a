"""Checks of the algorithm keys: estimators that need groups, DAPO dynamic sampling, rollout correction,
and the preference losses (DPO / KTO)."""

from typing import Any

from ..names import ROLLOUT_IS_LEVELS, ROLLOUT_RS_OPTIONS
from ..problem import Problem
from ..schema import Config, show
from .reward import manager_problems


def notices(cfg: Config) -> list[str]:
    """GRPO with one sample per prompt: it runs as verl's does, with no baseline."""
    a = cfg.algorithm
    if a.name == "rl" and a.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 1:
        return [
            "algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n=1: every group holds one response, "
            "so its advantage is its raw score (no baseline), as in verl; GRPO is meant for n > 1, e.g. "
            "actor_rollout_ref.rollout.n=5"
        ]
    return []


def algorithm_problems(cfg: Config, resolved: Config) -> list[Problem]:
    """Problems with the RL algorithm keys: estimators, DAPO, the reward manager, rollout correction.

    `cfg` is the config as written, `resolved` with inherited values filled in.
    """
    out = []
    r = resolved
    n = r.actor_rollout_ref.rollout.n
    if r.algorithm.name != "rl":
        return out
    if r.algorithm.adv_estimator == "grpo_passk" and n < 2:
        out.append(
            Problem(
                f"algorithm.adv_estimator=grpo_passk rewards the best of a prompt's samples; it needs "
                f"actor_rollout_ref.rollout.n >= 2 (got {n}); use e.g. actor_rollout_ref.rollout.n=4",
                ("actor_rollout_ref.rollout.n", "algorithm.adv_estimator"),
                {"actor_rollout_ref.rollout.n": 4},
            )
        )
    fg = r.algorithm.filter_groups
    if fg.enable and n < 2:
        out.append(
            Problem(
                f"algorithm.filter_groups.enable=true keeps prompts whose samples disagree, which needs "
                f"actor_rollout_ref.rollout.n >= 2 (got {n}); use e.g. actor_rollout_ref.rollout.n=8",
                ("actor_rollout_ref.rollout.n", "algorithm.filter_groups.enable"),
                {"actor_rollout_ref.rollout.n": 8},
            )
        )
    gen = cfg.data.gen_batch_size  # as written: null inherits train_batch_size, checked on its own
    if gen is not None and gen < 1:
        out.append(
            Problem(
                f"data.gen_batch_size={gen} must be >= 1; use e.g. data.gen_batch_size={r.data.train_batch_size}",
                ("data.gen_batch_size",),
                {"data.gen_batch_size": r.data.train_batch_size},
            )
        )
    if r.trainer.critic_warmup < 0:
        out.append(
            Problem(
                f"trainer.critic_warmup={r.trainer.critic_warmup} must be >= 0; use trainer.critic_warmup=0",
                ("trainer.critic_warmup",),
                {"trainer.critic_warmup": 0},
            )
        )
    out += manager_problems(cfg, r)
    out += _correction_problems(r)
    return out


def preference_problems(cfg: Config) -> list[Problem]:
    """preference.*: options of one DPO loss that another loss_type ignores."""
    p, out = cfg.preference, []
    if cfg.algorithm.name == "dpo" and p.label_smoothing > 0 and p.loss_type != "sigmoid":
        out.append(
            Problem(
                f"preference.label_smoothing={show(p.label_smoothing)} applies to the sigmoid loss only "
                f"(preference.loss_type={p.loss_type}); use preference.label_smoothing=0 or preference.loss_type=sigmoid",
                ("preference.label_smoothing", "preference.loss_type"),
                {"preference.label_smoothing": 0.0},
            )
        )
    return out


def _correction_problems(r: Config) -> list[Problem]:
    """algorithm.rollout_correction.*: importance weights and rejection sampling of the engine's samples."""
    out = []
    rc, key = r.algorithm.rollout_correction, "algorithm.rollout_correction"
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS_LEVELS:
        out.append(
            Problem(
                f"{key}.rollout_is={rc.rollout_is} is not one of token, sequence (or null = off); "
                f"use e.g. {key}.rollout_is=token",
                (f"{key}.rollout_is",),
                {f"{key}.rollout_is": "token"},
            )
        )
    if rc.rollout_is_threshold <= 0:
        out.append(
            Problem(
                f"{key}.rollout_is_threshold={rc.rollout_is_threshold} must be > 0; use e.g. 2.0",
                (f"{key}.rollout_is_threshold",),
                {f"{key}.rollout_is_threshold": 2.0},
            )
        )
    if rc.rollout_rs is not None:
        from_spec = _rs_spec_problem(rc.rollout_rs, rc.rollout_rs_threshold)
        if from_spec:
            out.append(
                Problem(
                    f"{key}.rollout_rs={rc.rollout_rs}, rollout_rs_threshold={rc.rollout_rs_threshold}: {from_spec}",
                    (f"{key}.rollout_rs", f"{key}.rollout_rs_threshold"),
                    None,
                )
            )
    if rc.bypass_mode and rc.loss_type != "ppo_clip":
        out.append(
            Problem(
                f"{key}.loss_type={rc.loss_type} is not available; bypass mode trains with the configured "
                f"policy loss: use {key}.loss_type=ppo_clip",
                (f"{key}.loss_type",),
                {f"{key}.loss_type": "ppo_clip"},
            )
        )
    if rc.bypass_mode and (rc.rollout_is is not None or rc.rollout_rs is not None):
        out.append(
            Problem(
                f"{key}.bypass_mode=true uses the engine's log-probs as the old ones, so there is no mismatch "
                f"left to correct: set {key}.rollout_is=null and {key}.rollout_rs=null, or bypass_mode=false",
                (f"{key}.bypass_mode",),
                {f"{key}.bypass_mode": False},
            )
        )
    return out


def _rs_spec_problem(rollout_rs: str, threshold: Any) -> str | None:
    """The rejection-sampling spec's problem in words, or None. Mirrors rollout_correction.parse_rs_*."""
    options = [o.strip() for o in str(rollout_rs).split(",") if o.strip()]
    bad = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if not options or bad:
        return f"each criterion must be one of {', '.join(ROLLOUT_RS_OPTIONS)}"
    if threshold is None:
        return "rollout_rs_threshold is required (e.g. 2.0, or 0.5_2.0 for a k1 criterion)"
    parts = [p.strip() for p in str(threshold).split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        return f"give one threshold for all criteria or one per criterion ({len(options)})"
    for option, part in zip(options, parts * len(options) if len(parts) == 1 else parts):
        try:
            if "_" in part and not option.endswith("k1"):
                raise ValueError(part)
            values = [float(x) for x in part.split("_", 1)]
        except ValueError:
            return f"threshold {part!r} for {option} must be a number" + (" or lower_upper" if option.endswith("k1") else "")
        if any(v <= 0 for v in values):
            return f"threshold {part!r} for {option} must be > 0"
        if option.endswith("k1") and (values if len(values) == 2 else [1 / values[0], values[0]])[0] > values[-1]:
            hint = " (YAML reads 0.5_2 as the number 0.52: quote it, '0.5_2')" if isinstance(threshold, float) else ""
            return f"threshold {part!r} for {option} gives a lower bound above the upper one{hint}"
    return None
