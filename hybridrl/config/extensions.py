"""User extensions (config key `extensions`), the names they may register, and the checks of the
algorithm keys (policy loss, DAPO, rollout correction, reward manager).

Advantage estimators and policy losses live in registries in hybridrl.algorithms; a user adds one
by calling `register_adv_estimator` / `register_policy_loss` in a file listed in `extensions`.
The config layer imports nothing from the layers above it, so it does not read those registries
itself: whoever composes the package hands it a function per key that returns the names
(`use_registry`; hybridrl/__init__.py does it once for the whole package). Validation, `explain`
and docs/config.md all take the allowed values from there, so a name registered by an extension
is as selectable as a built-in one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

_NAME_SOURCES: dict[str, Callable[[], Iterable[str]]] = {}

# Rule-based reward managers (verl's names); see hybridrl/rewards/managers.py.
REWARD_MANAGERS = ("naive", "dapo", "batch", "prime")
ROLLOUT_IS_LEVELS = ("token", "sequence")  # hybridrl.algorithms.rollout_correction.ROLLOUT_IS_LEVELS


def use_registry(key: str, names: Callable[[], Iterable[str]]) -> None:
    """Take the allowed values of config `key` from `names()`, asked each time a config is checked."""
    _NAME_SOURCES[key] = names


def registered_choices() -> dict[str, tuple[str, ...]]:
    """{config key: the names registered for it now}, for every key wired with `use_registry`."""
    return {key: tuple(names()) for key, names in _NAME_SOURCES.items()}


def load_extensions(entries: Iterable[str]) -> None:
    """Import every entry of `extensions`: a path ending in .py, or an importable module name.

    Idempotent: a file is registered in sys.modules under a name derived from its absolute path,
    and a module imported twice is not executed twice. Raises ValueError with a one-line reason.
    """
    for entry in entries:
        entry = str(entry)
        if entry.endswith(".py"):
            _import_file(entry)
            continue
        try:
            importlib.import_module(entry)
        except ImportError as e:
            raise ValueError(
                f"extensions: cannot import module {entry!r} ({e}); give a module name on sys.path or a .py file"
            ) from None


def _import_file(path: str) -> None:
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ValueError(f"extensions: file not found: {path!r} (resolved to {full})")
    name = "hybridrl_extension_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ValueError(f"extensions: importing {full} failed: {type(e).__name__}: {e}") from None


def algorithm_problems(cfg: Any, resolved: Any, problem: Callable[..., Any]) -> list:
    """Problems with the algorithm keys this module documents; `problem(message, keys, fix)` makes one.

    `cfg` is the config as written, `resolved` with inherited values filled in.
    """
    out = []
    r = resolved
    n = r.actor_rollout_ref.rollout.n
    if r.algorithm.name != "rl":
        return out
    if r.algorithm.adv_estimator == "grpo_passk" and n < 2:
        out.append(
            problem(
                f"algorithm.adv_estimator=grpo_passk rewards the best of a prompt's samples; it needs "
                f"actor_rollout_ref.rollout.n >= 2 (got {n}); use e.g. actor_rollout_ref.rollout.n=4",
                ("actor_rollout_ref.rollout.n", "algorithm.adv_estimator"),
                {"actor_rollout_ref.rollout.n": 4},
            )
        )
    fg = r.algorithm.filter_groups
    if fg.enable and n < 2:
        out.append(
            problem(
                f"algorithm.filter_groups.enable=true keeps prompts whose samples disagree, which needs "
                f"actor_rollout_ref.rollout.n >= 2 (got {n}); use e.g. actor_rollout_ref.rollout.n=8",
                ("actor_rollout_ref.rollout.n", "algorithm.filter_groups.enable"),
                {"actor_rollout_ref.rollout.n": 8},
            )
        )
    gen = cfg.data.gen_batch_size  # as written: null inherits train_batch_size, checked on its own
    if gen is not None and gen < 1:
        out.append(
            problem(
                f"data.gen_batch_size={gen} must be >= 1; use e.g. data.gen_batch_size={r.data.train_batch_size}",
                ("data.gen_batch_size",),
                {"data.gen_batch_size": r.data.train_batch_size},
            )
        )
    if r.trainer.critic_warmup < 0:
        out.append(
            problem(
                f"trainer.critic_warmup={r.trainer.critic_warmup} must be >= 0; use trainer.critic_warmup=0",
                ("trainer.critic_warmup",),
                {"trainer.critic_warmup": 0},
            )
        )
    out += _reward_problems(cfg, r, problem)
    out += _correction_problems(r, problem)
    return out


def _reward_problems(cfg: Any, r: Any, problem) -> list:
    out = []
    rm = r.reward_model
    if rm.reward_manager not in REWARD_MANAGERS:
        out.append(
            problem(
                f"reward_model.reward_manager={rm.reward_manager} is not one of {', '.join(REWARD_MANAGERS)}; "
                "use e.g. reward_model.reward_manager=naive",
                ("reward_model.reward_manager",),
                {"reward_model.reward_manager": "naive"},
            )
        )
    if rm.reward_manager == "batch" and not r.custom_reward_function.path:
        out.append(
            problem(
                "reward_model.reward_manager=batch calls custom_reward_function once with lists for the whole batch; set "
                "custom_reward_function.path to a file whose function takes data_sources, solution_strs, ground_truths, "
                "extra_infos, or use reward_model.reward_manager=naive",
                ("reward_model.reward_manager", "custom_reward_function.path"),
                {"reward_model.reward_manager": "naive"},
            )
        )
    ob = rm.overlong_buffer
    max_len = r.data.max_response_length
    if ob.enable and not 0 < ob.len <= max_len:
        fix = max(1, max_len // 4)
        out.append(
            problem(
                f"reward_model.overlong_buffer.len={ob.len} must be in [1, data.max_response_length={max_len}] when the "
                f"buffer is enabled; use e.g. reward_model.overlong_buffer.len={fix}",
                ("reward_model.overlong_buffer.len",),
                {"reward_model.overlong_buffer.len": fix},
            )
        )
    if ob.penalty_factor < 0:
        out.append(
            problem(
                f"reward_model.overlong_buffer.penalty_factor={ob.penalty_factor} must be >= 0; use e.g. 1.0",
                ("reward_model.overlong_buffer.penalty_factor",),
                {"reward_model.overlong_buffer.penalty_factor": 1.0},
            )
        )
    given = cfg.custom_reward_function.reward_kwargs.get("max_resp_len")
    if given is not None and given != max_len:
        out.append(
            problem(
                f"custom_reward_function.reward_kwargs.max_resp_len={given} differs from data.max_response_length={max_len}; "
                "the overlong buffer counts from data.max_response_length: drop max_resp_len or make them equal",
                ("custom_reward_function.reward_kwargs",),
                None,
            )
        )
    return out


def _correction_problems(r: Any, problem) -> list:
    out = []
    rc, key = r.algorithm.rollout_correction, "algorithm.rollout_correction"
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS_LEVELS:
        out.append(
            problem(
                f"{key}.rollout_is={rc.rollout_is} is not one of token, sequence (or null = off); "
                f"use e.g. {key}.rollout_is=token",
                (f"{key}.rollout_is",),
                {f"{key}.rollout_is": "token"},
            )
        )
    if rc.rollout_is_threshold <= 0:
        out.append(
            problem(
                f"{key}.rollout_is_threshold={rc.rollout_is_threshold} must be > 0; use e.g. 2.0",
                (f"{key}.rollout_is_threshold",),
                {f"{key}.rollout_is_threshold": 2.0},
            )
        )
    if rc.rollout_rs is not None:
        from_spec = _rs_spec_problem(rc.rollout_rs, rc.rollout_rs_threshold)
        if from_spec:
            out.append(
                problem(
                    f"{key}.rollout_rs={rc.rollout_rs}, rollout_rs_threshold={rc.rollout_rs_threshold}: {from_spec}",
                    (f"{key}.rollout_rs", f"{key}.rollout_rs_threshold"),
                    None,
                )
            )
    if rc.bypass_mode and rc.loss_type != "ppo_clip":
        out.append(
            problem(
                f"{key}.loss_type={rc.loss_type} is not available; bypass mode trains with the configured "
                f"policy loss: use {key}.loss_type=ppo_clip",
                (f"{key}.loss_type",),
                {f"{key}.loss_type": "ppo_clip"},
            )
        )
    if rc.bypass_mode and (rc.rollout_is is not None or rc.rollout_rs is not None):
        out.append(
            problem(
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
    known = (
        "token_k1",
        "token_k2",
        "token_k3",
        "seq_sum_k1",
        "seq_sum_k2",
        "seq_sum_k3",
        "seq_mean_k1",
        "seq_mean_k2",
        "seq_mean_k3",
        "seq_max_k2",
        "seq_max_k3",
    )
    bad = [o for o in options if o not in known]
    if not options or bad:
        return f"each criterion must be one of {', '.join(known)}"
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
