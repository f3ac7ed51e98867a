"""Config checks: every problem in a config, each naming its keys and a value that works.

Each key declares its own range rule and allowed names beside its field (`option(check=,
choices=)` in schema.py, rules in rules.py, name sets in names.py); `_range_problems` and
`_choice_problems` read them from there. A feature's rules that span several keys live with the
feature in `checks/` (rollout, reward, parallel, modes, algorithm, and the batch sizes with their
fix search in batch.py). This module runs them all, in one order, and adds the few rules
every run shares (a model, prompts, where to resume).
"""

import copy
from difflib import get_close_matches
from typing import Any

from .checks import algorithm, modes, moe, parallel, reward, rollout
from .checks.batch import PLAN_INPUTS, batch_problems
from .checks_files import file_problems
from .extensions import registered_choices
from .problem import Problem, get, suggest
from .schema import Config, resolve, show, walk

__all__ = ["CHOICES", "Problem", "all_choices", "config_notices", "find_problems", "validate"]

_ENTRIES = [e for e in walk(Config()) if not e.is_section]
_DEFAULTS = {e.path: e.value for e in _ENTRIES}
_RULES = [(e.path, e.check) for e in _ENTRIES if e.check is not None]  # from `option(check=)`
# Keys whose value must be one of a fixed set (for trainer.logger: every entry), from `option(choices=)`.
CHOICES: dict[str, tuple[str, ...]] = {e.path: e.choices for e in _ENTRIES if e.choices is not None}


def all_choices() -> dict[str, tuple[str, ...]]:
    """CHOICES plus the keys whose values are names in a registry (what is registered now)."""
    return {**CHOICES, **registered_choices()}


def config_notices(cfg: Config) -> list[str]:
    """Warnings about a valid config: settings that run, but probably not as meant."""
    return algorithm.notices(cfg) + rollout.notices(cfg) + reward.notices(cfg)


def validate(cfg: Config) -> list[str]:
    """Every problem in the config, one message each; empty when it is good to run."""
    return [p.message for p in find_problems(cfg)]


def find_problems(cfg: Config) -> list[Problem]:
    """Like `validate`, with the keys involved and a suggested fix for each problem."""
    r = resolve(copy.deepcopy(cfg))  # inherited values, as the run will see them
    problems = _range_problems(r) + _choice_problems(r) + _requirement_problems(r) + parallel.token_budget_problems(cfg)
    problems += reward.reward_model_problems(r) + modes.async_problems(r) + rollout.multi_turn_problems(r)
    problems += rollout.forced_length_problems(r) + moe.moe_problems(r)
    problems += algorithm.algorithm_problems(cfg, r) + rollout.tp_problems(r) + reward.remote_problems(r)
    problems += file_problems(r, Problem)  # names and files the config points at (checks_files.py)
    if not any(p.keys[0] in PLAN_INPUTS for p in problems):  # the batch rules need positive sizes
        problems += batch_problems(cfg)
    return problems


def _range_problems(cfg: Config) -> list[Problem]:
    out = []
    for key, (ok, rule) in _RULES:
        value = get(cfg, key)
        if value is None or (key.startswith("critic.") and not cfg.critic_enabled):
            continue
        if not ok(value):
            out.append(suggest(key, value, rule, _DEFAULTS[key]))
    return out


def _choice_problems(cfg: Config) -> list[Problem]:
    out = []
    for key, choices in all_choices().items():
        if key.startswith("critic.") and not cfg.critic_enabled:
            continue
        if key == "critic.loss_agg_mode" and cfg.critic.loss_agg_mode == cfg.actor_rollout_ref.actor.loss_agg_mode:
            continue  # inherited from the actor's: reported there once
        value = get(cfg, key)
        wrong = [v for v in (value if isinstance(value, list) else [value]) if v not in choices]
        if not wrong:
            continue
        if isinstance(value, list):
            fix = [v for v in value if v in choices] or _DEFAULTS[key]
            rule = f"has {', '.join(map(repr, wrong))}, not among {', '.join(choices)}"
            out.append(suggest(key, value, rule, fix))
            continue
        close = get_close_matches(str(value), choices, n=3, cutoff=0.5)
        fix = next((c for c in [*close, _DEFAULTS[key], *choices] if _harmless(cfg, key, c)), _DEFAULTS[key])
        problem = suggest(key, value, f"is not one of {', '.join(choices)}", fix)
        if close and close[0] != fix:
            problem.message += f" ({close[0]} would also need other keys changed)"
        out.append(problem)
    return out


def _harmless(cfg: Config, key: str, value: Any) -> bool:
    """Whether setting key=value adds no problem besides choice ones (e.g. resume_mode=resume_path
    without a path, or adv_estimator=grpo with rollout.n=1)."""

    def others(c: Config) -> set[str]:
        r = resolve(copy.deepcopy(c))
        return {p.message for p in _range_problems(r) + _requirement_problems(r) + batch_problems(c)}

    changed = copy.deepcopy(cfg)
    parent, _, name = key.rpartition(".")
    setattr(get(changed, parent), name, value)
    return others(changed) <= others(cfg)


def _requirement_problems(cfg: Config) -> list[Problem]:
    out = []
    if not cfg.actor_rollout_ref.model.path:
        out.append(
            Problem(
                "actor_rollout_ref.model.path is empty; set it to a local Hugging Face model directory, "
                "e.g. actor_rollout_ref.model.path=models/Qwen2.5-0.5B-Instruct",
                ("actor_rollout_ref.model.path",),
                {"actor_rollout_ref.model.path": "models/Qwen2.5-0.5B-Instruct"},
            )
        )
    files = cfg.data.train_files
    if not files or (isinstance(files, list) and not all(files)):
        out.append(
            Problem(
                f"data.train_files={show(files)} names no file; set it to parquet or jsonl prompt files, "
                "e.g. data.train_files=data/gsm8k/train.parquet",
                ("data.train_files",),
                {"data.train_files": "data/gsm8k/train.parquet"},
            )
        )
    t = cfg.trainer
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        out.append(
            Problem(
                "trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint directory such as "
                f"{t.default_local_dir}/checkpoints/step_100); or use trainer.resume_mode=auto to resume from the latest",
                ("trainer.resume_mode", "trainer.resume_from_path"),
                {"trainer.resume_mode": "auto"},
            )
        )
    bad = [s for s in t.profile_steps if not isinstance(s, int) or isinstance(s, bool) or s < 1]
    if bad:
        out.append(
            Problem(
                f"trainer.profile_steps={show(t.profile_steps)} has {show(bad)}, not a step number (1, 2, ...); "
                "e.g. trainer.profile_steps=[2] profiles the second step (the first one warms up)",
                ("trainer.profile_steps",),
                {"trainer.profile_steps": [2]},
            )
        )
    w = cfg.warmup
    if w.steps > 0 and (not w.files or (isinstance(w.files, list) and not all(w.files))):
        out.append(
            Problem(
                f"warmup.steps={w.steps} needs warmup.files (rows with a prompt and a `response` column); "
                "or use warmup.steps=0 to skip the warm-up",
                ("warmup.files", "warmup.steps"),
                {"warmup.steps": 0},
            )
        )
    out += reward.custom_function_problems(cfg)
    if not (isinstance(t.worker_timeout_s, (int, float)) and 0 < t.worker_timeout_s < float("inf")):
        out.append(suggest("trainer.worker_timeout_s", t.worker_timeout_s, "must be a positive number of seconds", 60.0))
    out += rollout.sampling_problems(cfg)
    out += algorithm.preference_problems(cfg)
    out += parallel.placement_problems(cfg)
    return out
