"""Config checks, and the batch plan: how global batch sizes become per-device ones.

Users state intent in global terms (prompts per step, samples per prompt, prompts per
optimizer step); `plan_batches` derives what each device does, with verl's semantics.
Every problem names the keys involved and suggests a value that works (`Problem.fix`), chosen
so that applying it does not break any other batch-size rule.
"""

import copy
import math
import os
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, Callable

from .checks_files import file_problems
from .extensions import algorithm_problems, registered_choices
from .layout import ParallelLayout, build_layout, layout_problem
from .schema import Config, ConfigError, resolve, show, walk

# algorithm.adv_estimator and actor.policy_loss.loss_mode take the names registered in
# hybridrl.algorithms (built-in or from `extensions`): see extensions.py and `all_choices`.
# Baselines from the other responses to the same prompt: RLOO needs n > 1 (leave-one-out over
# nothing otherwise); GRPO with n = 1 runs as verl's does (a group of one: mean 0, std 1, so the
# advantage is the score itself), with a warning (`config_notices`).
GROUP_ESTIMATORS = ("rloo",)
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_CTRL_TYPES = ("fixed", "adaptive")
TRUNCATIONS = ("error", "left", "right", "middle")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")
LOGGERS = ("console", "jsonl", "file", "tensorboard", "wandb", "mlflow", "swanlab")
ROLLOUT_NAMES = ("auto", "native", "hf", "vllm")
LR_SCHEDULERS = ("constant", "cosine")
ALGORITHM_NAMES = ("rl", "dpo", "kto", "sft", "rm")
PREFERENCE_ALGORITHMS = ("dpo", "kto")  # need a frozen reference policy
DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")
PACKED_ATTN_BACKENDS = ("auto", "varlen", "flex", "sdpa")  # hybridrl.models.packing.BACKENDS
TRAINER_MODES = ("sync", "one_step_off", "async")  # hybridrl/trainer/async_rollout.py

# Keys whose value must be one of a fixed set (for trainer.logger: every entry).
CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": TRUNCATIONS,
    "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG_MODES,
    "actor_rollout_ref.actor.kl_loss_type": KL_ESTIMATORS,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": LR_SCHEDULERS,
    "actor_rollout_ref.rollout.name": ROLLOUT_NAMES,
    "actor_rollout_ref.rollout.multi_turn.format": ("hermes", "code"),
    "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side": ("left", "middle", "right"),
    "critic.optim.lr_scheduler_type": LR_SCHEDULERS,
    "critic.loss_agg_mode": LOSS_AGG_MODES,
    "algorithm.kl_penalty": KL_ESTIMATORS,
    "algorithm.kl_ctrl.type": KL_CTRL_TYPES,
    "trainer.device": DEVICES,
    "trainer.logger": LOGGERS,
    "trainer.resume_mode": RESUME_MODES,
    "algorithm.name": ALGORITHM_NAMES,
    "preference.loss_type": DPO_LOSS_TYPES,
    "actor_rollout_ref.model.packed_attn_backend": PACKED_ATTN_BACKENDS,
    "trainer.mode": TRAINER_MODES,
}


def all_choices() -> dict[str, tuple[str, ...]]:
    """CHOICES plus the keys whose values are names in a registry (what is registered now)."""
    return {**CHOICES, **registered_choices()}


_Rule = tuple[Callable[[Any], bool], str]
_AT_LEAST_1: _Rule = (lambda v: v >= 1, "must be >= 1")
_AT_LEAST_0: _Rule = (lambda v: v >= 0, "must be >= 0")
_POSITIVE: _Rule = (lambda v: v > 0, "must be > 0")
_UNIT: _Rule = (lambda v: 0 <= v <= 1, "must be between 0 and 1")
_PROB: _Rule = (lambda v: 0 < v <= 1, "must be in (0, 1]")
_OFF_OR_1: _Rule = (lambda v: v == -1 or v >= 1, "must be -1 (off) or >= 1")
_OFF_OR_0: _Rule = (lambda v: v >= -1, "must be -1 (off) or >= 0")
_ABOVE_1: _Rule = (lambda v: v > 1, "must be > 1 (the dual-clip bound on the ratio for negative advantages)")


def _optim_rules(prefix: str) -> list[tuple[str, _Rule]]:
    return [
        (f"{prefix}.lr", _POSITIVE),
        (f"{prefix}.weight_decay", _AT_LEAST_0),
        (f"{prefix}.lr_warmup_steps_ratio", _UNIT),
        (f"{prefix}.lr_warmup_steps", _OFF_OR_0),
        (f"{prefix}.min_lr_ratio", _UNIT),
    ]


_A, _R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
# Range rules; a None value (an optional key left unset) is not checked.
# Keys under critic. are checked only when the critic is trained.
_RULES: list[tuple[str, _Rule]] = [
    ("data.max_prompt_length", _AT_LEAST_1),
    ("data.max_response_length", _AT_LEAST_1),
    ("actor_rollout_ref.rollout.decode_steps_per_sync", (lambda v: isinstance(v, int) and 1 <= v <= 64, "must be in [1, 64]")),
    ("data.train_batch_size", _AT_LEAST_1),
    ("data.val_batch_size", _AT_LEAST_1),
    ("data.val_max_samples", _AT_LEAST_1),
    (f"{_A}.ppo_mini_batch_size", _AT_LEAST_1),
    (f"{_A}.ppo_micro_batch_size_per_gpu", _AT_LEAST_1),
    (f"{_A}.ppo_epochs", _AT_LEAST_1),
    (f"{_A}.clip_ratio", _POSITIVE),
    (f"{_A}.clip_ratio_low", _POSITIVE),
    (f"{_A}.clip_ratio_high", _POSITIVE),
    (f"{_A}.clip_ratio_c", _ABOVE_1),
    (f"{_A}.kl_loss_coef", _AT_LEAST_0),
    (f"{_A}.grad_clip", _POSITIVE),
    *_optim_rules(f"{_A}.optim"),
    (f"{_R}.n", _AT_LEAST_1),
    (f"{_R}.temperature", _AT_LEAST_0),
    (f"{_R}.top_p", _PROB),
    (f"{_R}.top_k", _OFF_OR_1),
    (f"{_R}.max_num_seqs", _AT_LEAST_1),
    (f"{_R}.gpu_memory_utilization", _PROB),
    (f"{_R}.max_num_batched_tokens", _AT_LEAST_1),
    (f"{_R}.tensor_model_parallel_size", _AT_LEAST_1),
    (f"{_R}.log_prob_micro_batch_size_per_gpu", _AT_LEAST_1),
    (f"{_R}.val_kwargs.n", _AT_LEAST_1),
    (f"{_R}.val_kwargs.temperature", _AT_LEAST_0),
    (f"{_R}.val_kwargs.top_p", _PROB),
    (f"{_R}.val_kwargs.top_k", _OFF_OR_1),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", _AT_LEAST_1),
    ("critic.ppo_mini_batch_size", _AT_LEAST_1),
    ("critic.ppo_micro_batch_size_per_gpu", _AT_LEAST_1),
    ("critic.ppo_epochs", _AT_LEAST_1),
    ("critic.cliprange_value", _POSITIVE),
    ("critic.grad_clip", _POSITIVE),
    *_optim_rules("critic.optim"),
    ("algorithm.gamma", _UNIT),
    ("algorithm.lam", _UNIT),
    ("algorithm.kl_ctrl.kl_coef", _AT_LEAST_0),
    ("algorithm.kl_ctrl.target_kl", _POSITIVE),
    ("algorithm.kl_ctrl.horizon", _AT_LEAST_1),
    ("trainer.total_epochs", _AT_LEAST_1),
    ("async_training.max_staleness", _AT_LEAST_1),
    ("trainer.total_training_steps", _AT_LEAST_1),
    ("trainer.max_wall_time_s", _POSITIVE),
    ("trainer.n_gpus_per_node", _AT_LEAST_1),
    ("trainer.nnodes", _AT_LEAST_1),
    ("trainer.save_freq", _OFF_OR_1),
    ("trainer.test_freq", _OFF_OR_1),
    ("trainer.max_nonfinite_steps", _AT_LEAST_0),
    ("trainer.log_samples", _AT_LEAST_0),
    ("trainer.log_val_samples", _AT_LEAST_0),
    ("trainer.max_ckpt_to_keep", _AT_LEAST_1),
    ("trainer.max_restarts", _AT_LEAST_0),
    ("resource_pool.actor_rollout_ref", _AT_LEAST_1),
    ("resource_pool.critic", _AT_LEAST_1),
    ("resource_pool.reward_model", _AT_LEAST_1),
    ("resource_pool.rollout", _AT_LEAST_1),
    ("actor_rollout_ref.rollout.update_weights_bucket_megabytes", _POSITIVE),
    ("reward_model.micro_batch_size_per_gpu", _AT_LEAST_1),
    ("reward_model.forward_max_token_len_per_gpu", _AT_LEAST_1),
    ("reward_model.n_gpus_per_node", _AT_LEAST_1),
    ("reward_model.nnodes", _AT_LEAST_0),
    ("ray_init.num_cpus", _AT_LEAST_1),
    ("warmup.steps", _AT_LEAST_0),
    ("warmup.batch_size", _AT_LEAST_1),
    ("warmup.lr", _POSITIVE),
    ("actor_rollout_ref.model.lora_rank", _AT_LEAST_0),
    ("actor_rollout_ref.model.lora_alpha", _POSITIVE),
    (f"{_A}.ppo_max_token_len_per_gpu", _AT_LEAST_1),
    (f"{_R}.log_prob_max_token_len_per_gpu", _AT_LEAST_1),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", _AT_LEAST_1),
    ("critic.ppo_max_token_len_per_gpu", _AT_LEAST_1),
    (f"{_A}.ulysses_sequence_parallel_size", _AT_LEAST_1),
    ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", _AT_LEAST_1),
    ("critic.ulysses_sequence_parallel_size", _AT_LEAST_1),
    ("critic.forward_max_token_len_per_gpu", _AT_LEAST_1),
    ("preference.beta", _POSITIVE),
    ("preference.label_smoothing", (lambda v: 0 <= v < 0.5, "must be in [0, 0.5)")),
    ("preference.desirable_weight", _POSITIVE),
    ("preference.undesirable_weight", _POSITIVE),
]

_DEFAULTS = {e.path: e.value for e in walk(Config())}

# The keys the batch plan is computed from.
_TRAIN, _N = "data.train_batch_size", f"{_R}.n"
_NODES, _GPUS = "trainer.nnodes", "trainer.n_gpus_per_node"
_POOL = {"actor": "resource_pool.actor_rollout_ref", "critic": "resource_pool.critic"}
_MINI = {"actor": f"{_A}.ppo_mini_batch_size", "critic": "critic.ppo_mini_batch_size"}
_MICRO = {"actor": f"{_A}.ppo_micro_batch_size_per_gpu", "critic": "critic.ppo_micro_batch_size_per_gpu"}
_LOG_PROB_MICRO = {
    "rollout": f"{_R}.log_prob_micro_batch_size_per_gpu",
    "ref": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
}
_PLAN_INPUTS = {_TRAIN, _N, _NODES, _GPUS, *_MINI.values(), *_MICRO.values(), *_POOL.values()}
_BATCH_KEYS = {
    _TRAIN,
    _N,
    _NODES,
    _GPUS,
    *_MINI.values(),
    *_MICRO.values(),
    *_LOG_PROB_MICRO.values(),
    *_POOL.values(),
    "data.max_prompt_length",
    "data.max_response_length",
    f"{_R}.max_num_seqs",
    f"{_A}.ppo_epochs",
    "critic.ppo_epochs",
    "algorithm.adv_estimator",
    "algorithm.name",
    f"{_A}.fsdp_config.fsdp_size",
    "critic.model.fsdp_config.fsdp_size",
}


@dataclass
class Problem:
    """One thing wrong with a config."""

    message: str  # names the keys and suggests a value that works
    keys: tuple[str, ...]  # the keys involved, first the one to change
    fix: dict[str, Any] | None = None  # overrides that remove this problem, when one change does


def config_notices(cfg: Config) -> list[str]:
    """Warnings about a valid config: settings that run, but probably not as meant."""
    out = []
    a = cfg.algorithm
    if a.name == "rl" and a.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 1:
        out.append(
            "algorithm.adv_estimator=grpo with actor_rollout_ref.rollout.n=1: every group holds one response, "
            "so its advantage is its raw score (no baseline), as in verl; GRPO is meant for n > 1, e.g. "
            "actor_rollout_ref.rollout.n=5"
        )
    r = cfg.actor_rollout_ref.rollout
    for key in ("enable_prefix_caching", "enable_chunked_prefill"):
        if getattr(r, key) and (r.name in ("hf", "vllm") or r.tensor_model_parallel_size > 1):
            out.append(
                f"actor_rollout_ref.rollout.{key}=true applies to the native engine at tensor_model_parallel_size=1; "
                f"with rollout.name={r.name} and tensor_model_parallel_size={r.tensor_model_parallel_size} it does nothing"
            )
    if cfg.reward_model.launch_reward_fn_async and (a.filter_groups.enable or cfg.trainer.mode != "sync"):
        why = (
            "algorithm.filter_groups.enable=true (which groups to keep needs the scores)"
            if a.filter_groups.enable
            else f"trainer.mode={cfg.trainer.mode} (the rollout producer scores)"
        )
        out.append(f"reward_model.launch_reward_fn_async=true: scoring runs in the foreground with {why}")
    return out


def validate(cfg: Config) -> list[str]:
    """Every problem in the config, one message each; empty when it is good to run."""
    return [p.message for p in find_problems(cfg)]


def find_problems(cfg: Config) -> list[Problem]:
    """Like `validate`, with the keys involved and a suggested fix for each problem."""
    r = resolve(copy.deepcopy(cfg))  # inherited values, as the run will see them
    problems = _range_problems(r) + _choice_problems(r) + _requirement_problems(r) + _token_budget_problems(cfg)
    problems += _reward_model_problems(r) + _async_problems(r) + _multi_turn_problems(r)
    problems += algorithm_problems(cfg, r, Problem) + _rollout_tp_problems(r) + _remote_reward_problems(r)
    problems += file_problems(r, Problem)  # names and files the config points at (checks_files.py)
    if not any(p.keys[0] in _PLAN_INPUTS for p in problems):  # the batch rules need positive sizes
        problems += _batch_problems(cfg)
    return problems


def _multi_turn_problems(cfg: Config) -> list[Problem]:
    """rollout.multi_turn.*: sizes, the files it names, and what the agent loop runs on."""
    r, key = cfg.actor_rollout_ref.rollout, f"{_R}.multi_turn"
    mt, out = r.multi_turn, []
    if not mt.enable:
        return out
    for name, fix in {"max_assistant_turns": 4, "max_user_turns": 2, "max_turn_tokens": 512}.items():
        value = getattr(mt, name)
        if value is not None and not (isinstance(value, int) and value >= 1):
            out.append(_suggest(f"{key}.{name}", value, "must be >= 1 or null", fix))
    for name, fix in {"max_parallel_calls": 1, "max_tool_response_length": 256}.items():
        value = getattr(mt, name)
        if not (isinstance(value, int) and value >= 1):
            out.append(_suggest(f"{key}.{name}", value, "must be >= 1", fix))
    if not (isinstance(mt.tool_timeout_s, (int, float)) and 0 < mt.tool_timeout_s < float("inf")):
        out.append(_suggest(f"{key}.tool_timeout_s", mt.tool_timeout_s, "must be positive", 30.0))
    for name in ("tool_config_path", "interaction_config_path"):
        path = getattr(mt, name)
        if path is not None and not os.path.isfile(path):
            out.append(Problem(f"{key}.{name}={path}: no such file", (f"{key}.{name}",)))
    if mt.tool_config_path is None and mt.interaction_config_path is None:
        out.append(
            Problem(
                f"{key}.enable=true needs tools or an interaction: set {key}.tool_config_path (e.g. configs/tools/python.yaml) "
                f"or {key}.interaction_config_path",
                (f"{key}.tool_config_path",),
            )
        )
    if r.name in ("hf", "vllm"):
        out.append(
            Problem(
                f"{key}.enable=true runs on the native engine; {_R}.name={r.name} cannot pause and extend sequences: "
                f"set {_R}.name=native",
                (f"{_R}.name",),
                {f"{_R}.name": "native"},
            )
        )
    if r.tensor_model_parallel_size > 1:
        out.append(
            Problem(
                f"{key}.enable=true with {_R}.tensor_model_parallel_size={r.tensor_model_parallel_size}: multi-turn "
                f"rollouts run at tensor_model_parallel_size=1 for now (the ranks of a replica would have to agree on "
                f"when each tool answers)",
                (f"{_R}.tensor_model_parallel_size",),
                {f"{_R}.tensor_model_parallel_size": 1},
            )
        )
    return out


def _remote_reward_problems(cfg: Config) -> list[Problem]:
    """custom_reward_function.remote.* (hybridrl/rewards/remote.py)."""
    c, key = cfg.custom_reward_function, "custom_reward_function.remote"
    remote, out = c.remote, []
    if remote.url is None:
        return out
    if not (isinstance(remote.url, str) and remote.url.startswith(("http://", "https://"))):
        out.append(_suggest(f"{key}.url", remote.url, "must be an http:// or https:// URL", "http://127.0.0.1:8000/score"))
    if c.path:
        out.append(
            Problem(
                f"custom_reward_function.path={c.path} and {key}.url={remote.url} both set: score with one; "
                f"drop the path (custom_reward_function.path=null) or the URL ({key}.url=null)",
                ("custom_reward_function.path", f"{key}.url"),
                {f"{key}.url": None},
            )
        )
    positive = {"timeout_s": 10.0, "max_concurrency": 8, "circuit_breaker_cooldown_s": 30.0}
    for name, fix in positive.items():
        value = getattr(remote, name)
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            out.append(_suggest(f"{key}.{name}", value, "must be positive", fix))
    for name, fix in {"retries": 2, "backoff_s": 0.5, "circuit_breaker_failures": 5}.items():
        value = getattr(remote, name)
        if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
            out.append(_suggest(f"{key}.{name}", value, "must be 0 or more", fix))
    return out


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _suggest(key: str, value: Any, rule: str, fix: Any) -> Problem:
    return Problem(f"{key}={show(value)} {rule}; use e.g. {key}={show(fix)}", (key,), {key: fix})


def _range_problems(cfg: Config) -> list[Problem]:
    out = []
    for key, (ok, rule) in _RULES:
        value = _get(cfg, key)
        if value is None or (key.startswith("critic.") and not cfg.critic_enabled):
            continue
        if not ok(value):
            out.append(_suggest(key, value, rule, _DEFAULTS[key]))
    for key in (f"{_A}.optim.betas", "critic.optim.betas"):
        value = _get(cfg, key)
        if key.startswith("critic.") and not cfg.critic_enabled:
            continue
        if len(value) != 2 or not all(0 <= b < 1 for b in value):
            out.append(_suggest(key, value, "must be two numbers in [0, 1)", [0.9, 0.999]))
    return out


def _choice_problems(cfg: Config) -> list[Problem]:
    out = []
    for key, choices in all_choices().items():
        if key.startswith("critic.") and not cfg.critic_enabled:
            continue
        if key == "critic.loss_agg_mode" and cfg.critic.loss_agg_mode == cfg.actor_rollout_ref.actor.loss_agg_mode:
            continue  # inherited from the actor's: reported there once
        value = _get(cfg, key)
        wrong = [v for v in (value if isinstance(value, list) else [value]) if v not in choices]
        if not wrong:
            continue
        if isinstance(value, list):
            fix = [v for v in value if v in choices] or _DEFAULTS[key]
            rule = f"has {', '.join(map(repr, wrong))}, not among {', '.join(choices)}"
            out.append(_suggest(key, value, rule, fix))
            continue
        close = get_close_matches(str(value), choices, n=3, cutoff=0.5)
        fix = next((c for c in [*close, _DEFAULTS[key], *choices] if _harmless(cfg, key, c)), _DEFAULTS[key])
        problem = _suggest(key, value, f"is not one of {', '.join(choices)}", fix)
        if close and close[0] != fix:
            problem.message += f" ({close[0]} would also need other keys changed)"
        out.append(problem)
    return out


def _harmless(cfg: Config, key: str, value: Any) -> bool:
    """Whether setting key=value adds no problem besides choice ones (e.g. resume_mode=resume_path
    without a path, or adv_estimator=grpo with rollout.n=1)."""

    def others(c: Config) -> set[str]:
        r = resolve(copy.deepcopy(c))
        return {p.message for p in _range_problems(r) + _requirement_problems(r) + _batch_problems(c)}

    changed = copy.deepcopy(cfg)
    parent, _, name = key.rpartition(".")
    setattr(_get(changed, parent), name, value)
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
    reward = cfg.custom_reward_function
    if reward.path and not reward.name:
        out.append(
            _suggest("custom_reward_function.name", reward.name, f"must name a function in {reward.path}", "compute_score")
        )
    if not (isinstance(reward.timeout_s, (int, float)) and 0 < reward.timeout_s < float("inf")):
        out.append(
            _suggest(
                "custom_reward_function.timeout_s",
                reward.timeout_s,
                "must be a positive number of seconds (one reward call's limit)",
                10.0,
            )
        )
    if not (isinstance(reward.num_workers, int) and reward.num_workers >= 1):
        out.append(_suggest("custom_reward_function.num_workers", reward.num_workers, "must be 1 or more processes", 2))
    if not (isinstance(t.worker_timeout_s, (int, float)) and 0 < t.worker_timeout_s < float("inf")):
        out.append(_suggest("trainer.worker_timeout_s", t.worker_timeout_s, "must be a positive number of seconds", 60.0))
    for prefix in (_R, f"{_R}.val_kwargs"):
        sampling = _get(cfg, prefix)
        if sampling.do_sample and sampling.temperature == 0:
            out.append(
                Problem(
                    f"{prefix}.temperature=0 with {prefix}.do_sample=true cannot sample; use {prefix}.do_sample=false "
                    f"for greedy decoding, or a temperature such as 1.0",
                    (f"{prefix}.do_sample", f"{prefix}.temperature"),
                    {f"{prefix}.do_sample": False},
                )
            )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name in ("native", "auto") and max(rollout.n, rollout.val_kwargs.n) > rollout.max_num_seqs:
        n = max(rollout.n, rollout.val_kwargs.n)
        out.append(
            _suggest(
                f"{_R}.max_num_seqs",
                rollout.max_num_seqs,
                f"must be >= rollout.n={n} with rollout.name=native or auto (a prompt's samples run "
                "together in the native engine)",
                n,
            )
        )
    out += _offline_problems(cfg)
    out += _placement_problems(cfg)
    return out


def _actor_share_missing(key: str, apart: int, gpus: int) -> Problem:
    """A pool apart from the actor's (`key`=`apart` devices per node) with resource_pool.actor_rollout_ref unset."""
    fix = max(gpus - apart, 1)
    return Problem(
        f"{key}={apart} splits the devices, so resource_pool.actor_rollout_ref must say how many of the {gpus} "
        f"per node the actor gets; use e.g. resource_pool.actor_rollout_ref={fix}",
        ("resource_pool.actor_rollout_ref", key),
        {"resource_pool.actor_rollout_ref": fix},
    )


def _rollout_pool_problems(cfg: Config) -> list[Problem]:
    """resource_pool.rollout: rollout replicas on devices of their own (workers/rollout.py)."""
    pool, gpus, out = cfg.resource_pool, cfg.trainer.n_gpus_per_node, []
    rollout, actor = pool.rollout, pool.actor_rollout_ref
    if rollout is None:
        return out
    if actor is None:
        out.append(_actor_share_missing("resource_pool.rollout", rollout, gpus))
    else:
        used = actor + rollout + (pool.critic or 0 if cfg.critic_enabled else 0) + (pool.reward_model or 0)
        if used > gpus:
            out.append(
                Problem(
                    f"the actor, rollout (and critic / reward model) pools take {used} devices per node, more than "
                    f"trainer.n_gpus_per_node={gpus}; use e.g. trainer.n_gpus_per_node={used}",
                    ("trainer.n_gpus_per_node", "resource_pool.rollout"),
                    {"trainer.n_gpus_per_node": used},
                )
            )
    if cfg.algorithm.name != "rl":
        out.append(
            _suggest(
                "resource_pool.rollout",
                rollout,
                f"places rollout replicas, but algorithm.name={cfg.algorithm.name} does not generate",
                None,
            )
        )
    tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    if tp > 1:
        out.append(
            _suggest(
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                tp,
                "is not supported with resource_pool.rollout yet (each rollout rank is one replica)",
                1,
            )
        )
    return out


def _partial_rollout_problems(cfg: Config) -> list[Problem]:
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
    return [] if why is None else [_suggest(key, True, why, False)]


def _placement_problems(cfg: Config) -> list[Problem]:
    """resource_pool against the devices there are, and warm-up batches against the dp size."""
    pool, gpus, out = cfg.resource_pool, cfg.trainer.n_gpus_per_node, []
    actor, critic = pool.actor_rollout_ref, pool.critic
    if actor is not None and actor > gpus:
        out.append(_suggest("resource_pool.actor_rollout_ref", actor, f"is more than trainer.n_gpus_per_node={gpus}", None))
    if critic is not None:
        if not cfg.critic_enabled:
            out.append(
                Problem(
                    f"resource_pool.critic={critic} but no critic is trained (algorithm.adv_estimator="
                    f"{cfg.algorithm.adv_estimator}); use resource_pool.critic=null",
                    ("resource_pool.critic", "algorithm.adv_estimator"),
                    {"resource_pool.critic": None},
                )
            )
        elif actor is None:
            out.append(_actor_share_missing("resource_pool.critic", critic, gpus))
        elif actor + critic > gpus:
            out.append(
                Problem(
                    f"resource_pool.actor_rollout_ref={actor} + resource_pool.critic={critic} devices per node is more than "
                    f"trainer.n_gpus_per_node={gpus}; use e.g. trainer.n_gpus_per_node={actor + critic}",
                    ("resource_pool.critic", "resource_pool.actor_rollout_ref", "trainer.n_gpus_per_node"),
                    {"trainer.n_gpus_per_node": actor + critic},
                )
            )
    out += _rollout_pool_problems(cfg) + _partial_rollout_problems(cfg)
    w, dp = cfg.warmup, cfg.trainer.nnodes * (actor or gpus)
    if w.steps > 0 and w.batch_size % dp:
        fix = max(dp, w.batch_size - w.batch_size % dp)
        out.append(_suggest("warmup.batch_size", w.batch_size, f"must divide by the actor's data-parallel size {dp}", fix))
    return out + _layout_problems(cfg)


def _reward_model_problems(cfg: Config) -> list[Problem]:
    """reward_model.* (the worker) and algorithm.name=rm (docs/reward_models.md)."""
    rm, out = cfg.reward_model, []
    if rm.strategy not in ("fsdp", "fsdp2"):
        out.append(
            _suggest("reward_model.strategy", rm.strategy, "is not one of fsdp, fsdp2 (Megatron is not supported)", "fsdp")
        )
    for key in ("reward_weight", "rule_weight"):
        if not math.isfinite(getattr(rm, key)):
            out.append(
                _suggest(
                    f"reward_model.{key}", getattr(rm, key), "must be a finite number", 1.0 if key == "reward_weight" else 0.0
                )
            )
    own = cfg.reward_model_pool
    if own and not rm.enable:
        key = "resource_pool.reward_model" if cfg.resource_pool.reward_model else "reward_model.enable_resource_pool"
        out.append(Problem(f"{key} places a reward model, but reward_model.enable=false; set reward_model.enable=true", (key,)))
    if own and own[1] != cfg.trainer.nnodes:
        out.append(
            _suggest(
                "reward_model.nnodes",
                rm.nnodes,
                f"differs from trainer.nnodes={cfg.trainer.nnodes}; pools span the same nodes",
                0,
            )
        )
    # verl's spelling (reward_model.enable_resource_pool) adds the reward model's devices to trainer.n_gpus_per_node,
    # the actor's; resource_pool.reward_model takes them out of trainer.n_gpus_per_node, as resource_pool.critic does.
    if own and cfg.resource_pool.reward_model:
        pool, gpus = cfg.resource_pool, cfg.trainer.n_gpus_per_node
        actor = pool.actor_rollout_ref
        used = (actor or 0) + (pool.critic or 0 if cfg.critic_enabled else 0) + own[0]
        if actor is None:
            out.append(
                Problem(
                    f"the reward model's own pool ({own[0]} devices per node) splits the devices, so "
                    f"resource_pool.actor_rollout_ref must say how many of the {gpus} per node the actor gets; use e.g. "
                    f"resource_pool.actor_rollout_ref={max(gpus - own[0], 1)}",
                    ("resource_pool.actor_rollout_ref", "resource_pool.reward_model"),
                    {"resource_pool.actor_rollout_ref": max(gpus - own[0], 1)},
                )
            )
        elif used > gpus:
            out.append(
                Problem(
                    f"actor + critic + reward model pools take {used} devices per node, more than "
                    f"trainer.n_gpus_per_node={gpus}; use e.g. trainer.n_gpus_per_node={used}",
                    ("trainer.n_gpus_per_node", "resource_pool.reward_model"),
                    {"trainer.n_gpus_per_node": used},
                )
            )
    if cfg.algorithm.name == "rm" and cfg.warmup.steps > 0:
        out.append(_suggest("warmup.steps", cfg.warmup.steps, "is a policy warm-up; algorithm.name=rm trains a reward model", 0))
    return out


def _layout_problems(cfg: Config) -> list[Problem]:
    """Sizes that cannot be laid out on a role's ranks (config/layout.py), with a value that works."""
    out, s = [], _sizes(cfg)
    roles = [("actor", f"{_A}.fsdp_config.fsdp_size", cfg.actor_rollout_ref.actor.fsdp_config.fsdp_size)]
    if cfg.critic_enabled and cfg.resource_pool.critic:  # colocated, the critic uses the actor's layout
        roles.append(("critic", "critic.model.fsdp_config.fsdp_size", cfg.critic.model.fsdp_config.fsdp_size))
    for role, key, fsdp_size in roles:
        problem = layout_problem(_world(s, role), fsdp_size, _sp(cfg, role))
        if problem:
            which, what, fix = problem
            if which == "sp":
                key = _SP_KEYS[role]
            out.append(Problem(f"{key}{what}; use e.g. {key}={fix}", (key, _NODES, _GPUS), {key: fix}))
    return out + _sp_problems(cfg)


_SP_KEYS = {
    "actor": f"{_A}.ulysses_sequence_parallel_size",
    "ref": "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    "critic": "critic.ulysses_sequence_parallel_size",
}


def _sp(cfg: Config, role: str) -> int:
    """A role's Ulysses degree (null ref/critic degrees are the actor's); 1 for a value that is no
    positive integer (the range check names it)."""
    a = cfg.actor_rollout_ref
    value = {"actor": a.actor, "ref": a.ref, "critic": cfg.critic}[role].ulysses_sequence_parallel_size
    if value is None:
        value = a.actor.ulysses_sequence_parallel_size
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _sp_problems(cfg: Config) -> list[Problem]:
    """Sequence parallelism: one degree per process, heads divisible by it, not the flex backend."""
    out, a = [], cfg.actor_rollout_ref
    sp = _sp(cfg, "actor")
    if _sp(cfg, "ref") != sp:
        key = _SP_KEYS["ref"]
        out.append(
            Problem(
                f"{key}={_sp(cfg, 'ref')}: the reference runs in the actor's processes, so it uses the actor's "
                f"sequence parallelism ({sp}); remove {key} or set it to {sp}",
                (key,),
                {key: sp},
            )
        )
    if cfg.critic_enabled and not cfg.resource_pool.critic and _sp(cfg, "critic") != sp:
        key = _SP_KEYS["critic"]
        out.append(
            Problem(
                f"{key}={_sp(cfg, 'critic')}: a colocated critic shares the actor's processes and its sequence "
                f"parallelism ({sp}); set {key}={sp}, or give the critic its own resource_pool.critic",
                (key,),
                {key: sp},
            )
        )
    # Padded passes (use_remove_padding=false) run whole sequences on every rank of an sp group:
    # the same values and gradients (the normalizers count every rank), without the memory saving.
    for role in ("actor", "critic") if cfg.critic_enabled else ("actor",):
        degree = _sp(cfg, role)
        if degree == 1:
            continue
        if a.model.packed_attn_backend == "flex":
            key = "actor_rollout_ref.model.packed_attn_backend"
            out.append(
                Problem(
                    f"{_SP_KEYS[role]}={degree} runs the varlen or sdpa packed attention; set {key}=auto", (key,), {key: "auto"}
                )
            )
        path = (cfg.critic.model.path or a.model.path) if role == "critic" else a.model.path
        heads = _model_heads(path)
        if heads and heads % degree:
            fix = max(d for d in range(1, degree + 1) if heads % d == 0)
            out.append(
                Problem(
                    f"{_SP_KEYS[role]}={degree}: the model's {heads} attention heads do not split over {degree} "
                    f"devices; use e.g. {_SP_KEYS[role]}={fix}",
                    (_SP_KEYS[role],),
                    {_SP_KEYS[role]: fix},
                )
            )
    return out


def _model_heads(path: str | None) -> int | None:
    """num_attention_heads of the model directory's config.json; None when there is none to read."""
    import json
    from pathlib import Path

    file = Path(path or "") / "config.json"
    if not path or not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    heads = raw.get("text_config", raw).get("num_attention_heads")
    return heads if isinstance(heads, int) and heads > 0 else None


def _rollout_tp_problems(cfg: Config) -> list[Problem]:
    """rollout.tensor_model_parallel_size: it must divide the actor's ranks, fit the model's heads
    (read from the model directory's config.json when there is one) and run on the native engine."""
    r, key = cfg.actor_rollout_ref.rollout, f"{_R}.tensor_model_parallel_size"
    tp = r.tensor_model_parallel_size
    if not isinstance(tp, int) or tp <= 1:
        return []
    out, world = [], _world(_sizes(cfg), "actor")
    problem = layout_problem(world, -1, 1, tp)
    if problem:
        fix = problem[2]
        out.append(
            Problem(
                f"{key}={tp} does not divide the actor's {world} rank(s) (trainer.nnodes x n_gpus_per_node): each "
                f"rollout replica is tp consecutive ranks; use e.g. {key}={fix}",
                (key, _NODES, _GPUS),
                {key: fix},
            )
        )
    if r.name in ("hf", "vllm") or (r.name == "auto" and cfg.trainer.device == "cpu"):
        out.append(
            Problem(
                f"{key}={tp} needs the native engine, not rollout.name={r.name}"
                f"{' (auto is hf on CPU)' if r.name == 'auto' else ''}; set {_R}.name=native, or {key}=1",
                (f"{_R}.name", key),
                {f"{_R}.name": "native"},
            )
        )
    reason = _model_tp_problem(cfg.actor_rollout_ref.model.path, tp)
    if reason:
        out.append(Problem(f"{key}: {reason}", (key,), {key: 1}))
    return out


def _model_tp_problem(path: str | None, tp: int) -> str | None:
    """`tp_shards.check_tp` on the model directory's config.json; None when there is none to read."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from hybridrl.models.tp_shards import check_tp  # the shard spec's own rule (pure; no model is built)

    file = Path(path or "") / "config.json"
    if not path or not file.is_file():
        return None
    raw = json.loads(file.read_text())
    raw = raw.get("text_config", raw)
    if not all(k in raw for k in ("num_attention_heads", "intermediate_size", "hidden_size")):
        return None
    raw.setdefault("num_key_value_heads", raw["num_attention_heads"])
    return check_tp(SimpleNamespace(**raw), tp)


def _token_budget_problems(cfg: Config) -> list[Problem]:
    """With use_dynamic_bsz, the longest possible sequence must fit one micro-batch's budget.
    A budget equal to the one it inherits from is treated as inherited (as `_sizes` does, since
    loading resolves the config) and reported once, under the key it comes from."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    a, c = cfg.actor_rollout_ref, cfg.critic
    actor = (f"{_A}.ppo_max_token_len_per_gpu", a.actor.use_dynamic_bsz, a.actor.ppo_max_token_len_per_gpu, None)
    # (key, dynamic on, budget, the entry it inherits the budget from)
    budgets = [actor]
    for part, section in ((a.rollout, _R), (a.ref, "actor_rollout_ref.ref")):
        on = a.actor.use_dynamic_bsz if part.log_prob_use_dynamic_bsz is None else part.log_prob_use_dynamic_bsz
        inherited = part.log_prob_max_token_len_per_gpu in (None, a.actor.ppo_max_token_len_per_gpu)
        budget = a.actor.ppo_max_token_len_per_gpu if inherited else part.log_prob_max_token_len_per_gpu
        budgets.append((f"{section}.log_prob_max_token_len_per_gpu", on, budget, actor[0] if inherited else None))
    if cfg.critic_enabled:
        critic_on = a.actor.use_dynamic_bsz if c.use_dynamic_bsz is None else c.use_dynamic_bsz
        budgets.append(("critic.ppo_max_token_len_per_gpu", critic_on, c.ppo_max_token_len_per_gpu, None))
        inherited = c.forward_max_token_len_per_gpu in (None, c.ppo_max_token_len_per_gpu)
        budgets.append(
            (
                "critic.forward_max_token_len_per_gpu",
                critic_on,
                c.ppo_max_token_len_per_gpu if inherited else c.forward_max_token_len_per_gpu,
                "critic.ppo_max_token_len_per_gpu" if inherited else None,
            )
        )
    out, reported = [], set()
    for key, on, budget, source in budgets:
        if not on or budget is None or not 1 <= budget < longest:
            continue
        if source in reported:
            continue  # the same number, already reported under the key it comes from
        key = source or key
        reported.add(key)
        out.append(
            Problem(
                f"{key}={budget} is below the longest possible sequence, data.max_prompt_length + "
                f"data.max_response_length = {longest} tokens, which must fit one micro-batch; use e.g. {key}={longest}",
                (key, "data.max_prompt_length", "data.max_response_length"),
                {key: longest},
            )
        )
    return out


# --------------------------------------------------------------------------- batch plan


@dataclass(frozen=True)
class RolePlan:
    """How one trained role (actor or critic) splits a step's sequences."""

    mini_batch_prompts: int  # ppo_mini_batch_size
    mini_batch_sequences: int  # x rollout.n
    per_device_mini_batch: int  # / dp: sequences one device contributes to an optimizer step
    micro_batch: int  # sequences per forward/backward pass on one device
    grad_accum: int  # micro-batches per optimizer step
    num_mini_batches: int  # optimizer steps per epoch = train_batch_size / ppo_mini_batch_size
    epochs: int  # ppo_epochs
    optimizer_steps_per_step: int  # num_mini_batches x epochs
    tokens_per_micro_batch: int  # micro_batch x (max_prompt_length + max_response_length), padded bound
    dp: int = 1  # this role's data-parallel size (its own devices with split placement): layout.dp
    layout: ParallelLayout = ParallelLayout(1)  # how the role's ranks split into dp x sp (FSDP / HSDP), rollout x tp


@dataclass(frozen=True)
class BatchPlan:
    """Per-step and per-device batch sizes derived from the global ones."""

    nnodes: int
    devices_per_node: int  # the actor's: resource_pool.actor_rollout_ref or n_gpus_per_node
    dp: int  # the actor's data-parallel size: nnodes x devices_per_node
    prompts_per_step: int  # data.train_batch_size
    sequences_per_step: int  # x rollout.n
    sequences_per_device: int  # / dp
    max_num_seqs: int  # rollout.max_num_seqs
    generation_rounds: int  # ceil(sequences_per_device / max_num_seqs)
    tokens_per_sequence: int  # max_prompt_length + max_response_length
    actor: RolePlan
    critic: RolePlan | None  # None when no critic is trained (adv_estimator != gae)
    rollout_log_prob_micro_batch: int  # sequences per old-log-prob forward pass on one device
    rollout_log_prob_passes: int
    uses_ref: bool  # a KL term needs reference log-probs (actor.use_kl_loss or algorithm.use_kl_in_reward)
    ref_log_prob_micro_batch: int
    ref_log_prob_passes: int
    reward_model_layout: ParallelLayout | None = None  # its own pool (Config.reward_model_pool); None = the actor's
    rollout_layout: ParallelLayout | None = None  # resource_pool.rollout's replicas, one per rank; None = the actor's


def plan_batches(cfg: Config) -> BatchPlan:
    """The batch plan; raises ConfigError naming the keys to change when sizes do not fit."""
    problems = [p for p in find_problems(cfg) if p.keys[0] in _BATCH_KEYS]
    if problems:
        raise ConfigError([p.message for p in problems])
    r = resolve(copy.deepcopy(cfg))
    if r.algorithm.name != "rl":
        _as_offline_plan(r)
    a, rollout = r.actor_rollout_ref, r.actor_rollout_ref.rollout
    sizes = _sizes(r)
    actor_layout = build_layout(
        _world(sizes, "actor"), a.actor.fsdp_config.fsdp_size, sp=_sp(r, "actor"), tp=rollout.tensor_model_parallel_size
    )
    critic_layout = (
        build_layout(_world(sizes, "critic"), r.critic.model.fsdp_config.fsdp_size, sp=_sp(r, "critic"))
        if r.critic_enabled and r.resource_pool.critic
        else actor_layout
    )
    dp = actor_layout.dp  # the actor's data-parallel size: rollout and log-probs run there
    per_device = r.data.train_batch_size * rollout.n // dp
    seq_tokens = r.data.max_prompt_length + r.data.max_response_length

    def role(mini: int, micro: int | None, epochs: int, layout: ParallelLayout) -> RolePlan:
        dp = layout.dp
        per_device_mini = mini * rollout.n // dp
        micro = micro or per_device_mini
        steps = r.data.train_batch_size // mini
        return RolePlan(
            mini_batch_prompts=mini,
            mini_batch_sequences=mini * rollout.n,
            per_device_mini_batch=per_device_mini,
            micro_batch=micro,
            grad_accum=per_device_mini // micro,
            num_mini_batches=steps,
            epochs=epochs,
            optimizer_steps_per_step=steps * epochs,
            tokens_per_micro_batch=micro * seq_tokens,
            dp=dp,
            layout=layout,
        )

    def log_prob_micro(configured: int | None) -> int:
        return min(configured or per_device, per_device)

    rollout_micro = log_prob_micro(rollout.log_prob_micro_batch_size_per_gpu)
    ref_micro = log_prob_micro(a.ref.log_prob_micro_batch_size_per_gpu)
    critic = r.critic
    return BatchPlan(
        nnodes=r.trainer.nnodes,
        devices_per_node=actor_layout.world // r.trainer.nnodes,
        dp=dp,
        prompts_per_step=r.data.train_batch_size,
        sequences_per_step=r.data.train_batch_size * rollout.n,
        sequences_per_device=per_device,
        max_num_seqs=rollout.max_num_seqs,
        generation_rounds=math.ceil(per_device / rollout.max_num_seqs),
        tokens_per_sequence=seq_tokens,
        actor=role(a.actor.ppo_mini_batch_size, a.actor.ppo_micro_batch_size_per_gpu, a.actor.ppo_epochs, actor_layout),
        critic=role(critic.ppo_mini_batch_size, critic.ppo_micro_batch_size_per_gpu, critic.ppo_epochs, critic_layout)
        if r.critic_enabled
        else None,
        rollout_log_prob_micro_batch=rollout_micro,
        rollout_log_prob_passes=math.ceil(per_device / rollout_micro),
        uses_ref=a.actor.use_kl_loss or r.algorithm.use_kl_in_reward or r.algorithm.name in PREFERENCE_ALGORITHMS,
        ref_log_prob_micro_batch=ref_micro,
        ref_log_prob_passes=math.ceil(per_device / ref_micro),
        reward_model_layout=build_layout(math.prod(r.reward_model_pool), -1) if r.reward_model_pool else None,
        rollout_layout=build_layout(r.resource_pool.rollout * r.trainer.nnodes, -1) if r.resource_pool.rollout else None,
    )


# The batch rules work on a flat {key: int} view so that a candidate fix can be tried by
# changing one entry. A critic mini-batch of None inherits the actor's.
_Sizes = dict[str, Any]
_Context = tuple[bool, bool]  # (critic trained, estimator needs groups)


def _sizes(cfg: Config) -> _Sizes:
    keys = [_TRAIN, _N, _NODES, _GPUS, *_MINI.values(), *_MICRO.values(), *_POOL.values()]
    s = {k: _get(cfg, k) for k in keys}
    if s[_MINI["critic"]] == s[_MINI["actor"]]:  # as after `resolve`: treat as inherited, one report
        s[_MINI["critic"]] = None
    s["sp.actor"] = _sp(cfg, "actor")
    s["sp.critic"] = _sp(cfg, "critic") if cfg.resource_pool.critic else s["sp.actor"]
    return s


def _world(s: _Sizes, role: str) -> int:
    """A role's devices: its devices per node (resource_pool) x nodes. The critic shares the
    actor's devices unless it has its own."""
    per_node = s[_POOL[role]] if role == "critic" and s[_POOL["critic"]] else s[_POOL["actor"]] or s[_GPUS]
    return s[_NODES] * per_node


def _dp(s: _Sizes, role: str) -> int:
    """A role's data-parallel size: its devices / its sequence-parallel degree (the sp devices of
    a group share one batch shard)."""
    world, sp = _world(s, role), s[f"sp.{role}"]
    return world // sp if world % sp == 0 else world


def _mini(s: _Sizes, role: str) -> int:
    own = s[_MINI[role]]
    return s[_MINI["actor"]] if own is None else own


def _role_failure(s: _Sizes, role: str) -> str | None:
    train, n, dp, mini, micro = s[_TRAIN], s[_N], _dp(s, role), _mini(s, role), s[_MICRO[role]]
    if train % mini:
        return "divides"
    if mini * n % dp:
        return "split"
    if micro is not None and (mini * n // dp) % micro:
        return "micro"
    return None


def _failures(s: _Sizes, ctx: _Context) -> set[tuple[str, str]]:
    critic_on, grouped = ctx
    out = set()
    actor = _role_failure(s, "actor")
    if actor:
        out.add(("actor", actor))
    if critic_on:
        critic = _role_failure(s, "critic")
        same_dp = _dp(s, "critic") == _dp(s, "actor")
        inherited = s[_MINI["critic"]] is None and (
            critic == "divides" or critic == "split" and same_dp
        )  # reported for the actor
        if critic and not inherited:
            out.add(("critic", critic))
    if grouped and s[_N] < 2:
        out.add(("algorithm", "group"))
    return out


def _removes(s: _Sizes, change: dict[str, Any], failure: tuple[str, str], ctx: _Context) -> bool:
    """Whether the change removes `failure` and breaks nothing that was fine: no role (actor,
    critic, algorithm) that passed before fails after it."""
    before = {role for role, _ in _failures(s, ctx) - {failure}}
    after = _failures({**s, **change}, ctx)
    return failure not in after and {role for role, _ in after} <= before


def _working_values(s: _Sizes, key: str, candidates: Any, failure: tuple[str, str], ctx: _Context) -> list[int]:
    """The nearest candidate below and above the current value that remove `failure`
    without breaking anything else."""
    current = s[key] if s[key] is not None else _mini(s, "actor")
    good = [v for v in candidates if v != current and _removes(s, {key: v}, failure, ctx)]
    below = [v for v in good if v < current]
    above = [v for v in good if v > current]
    return ([max(below)] if below else []) + ([min(above)] if above else [])


def _divisors(x: int) -> list[int]:
    return [d for d in range(1, x + 1) if x % d == 0]


def _batch_problems(cfg: Config) -> list[Problem]:
    if cfg.algorithm.name not in ALGORITHM_NAMES:
        return []  # reported as a bad choice; no batch plan to check
    if cfg.algorithm.name != "rl":
        return _offline_batch_problems(cfg)
    s = _sizes(cfg)
    ctx = (cfg.critic_enabled, cfg.algorithm.adv_estimator in GROUP_ESTIMATORS)
    return [_describe(s, role, kind, ctx, cfg) for role, kind in sorted(_failures(s, ctx))]


def _describe(s: _Sizes, role: str, kind: str, ctx: _Context, cfg: Config) -> Problem:
    train, n, nodes = s[_TRAIN], s[_N], s[_NODES]
    failure = (role, kind)
    if kind == "group":
        values = [5] if _removes(s, {_N: 5}, failure, ctx) else []
        values = values or _working_values(s, _N, range(2, max(4 * n, 16) + 1), failure, ctx)
        text = (
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} compares several responses to the same "
            f"prompt, so it needs {_N} > 1 (got {n})"
        )
        return _with_fix(text, (_N, "algorithm.adv_estimator"), _N, values, f"use {_N}=")

    dp = _dp(s, role)
    gpus_key = _POOL["critic"] if role == "critic" and s[_POOL["critic"]] else _POOL["actor"] if s[_POOL["actor"]] else _GPUS
    gpus = s[gpus_key]
    mini_key = _MINI[role] if s[_MINI[role]] is not None else _MINI["actor"]
    mini, micro_key = _mini(s, role), _MICRO[role]
    mini_text = f"{mini_key}={mini}"
    if kind == "divides":
        verb = "is larger than" if mini > train else "does not divide"
        text = f"{mini_text} {verb} {_TRAIN}={train}"
        keys = (mini_key, _TRAIN)
        values = _working_values(s, mini_key, _divisors(train), failure, ctx)
        if values:
            return _with_fix(text, keys, mini_key, values, "use a divisor such as ")
        values = _working_values(s, _TRAIN, range(mini, 4 * max(train, mini) + 1, mini), failure, ctx)
        if values:
            return _with_fix(text, keys, _TRAIN, values, f"use a multiple of {mini} such as {_TRAIN}=")
        joint = _joint_fix(s, role, mini_key, failure, ctx)
        if joint:
            return Problem(f"{text}; use {_show_fix(joint)}", keys, joint)
        return Problem(f"{text}; change several of {', '.join(keys)} together", keys)
    if kind == "split":
        text = (
            f"{mini_text} x {_N}={n} = {mini * n} sequences per mini-batch cannot be split evenly over "
            f"data-parallel size {dp} ({_NODES}={nodes} x {gpus_key}={gpus})"
        )
        keys = (mini_key, _N, _NODES, _GPUS)
        values = _working_values(s, mini_key, _divisors(train), failure, ctx)
        if values:
            return _with_fix(text, keys, mini_key, values, "use a value such as ")
        # No mini-batch size works with this train batch: change the batch sizes together
        # (keeps the algorithm as it is), or the samples per prompt, or the device count.
        fixes = [f for f in (_joint_fix(s, role, mini_key, failure, ctx),) if f]
        fixes += [{_N: v} for v in _working_values(s, _N, range(1, max(4 * n, 16) + 1), failure, ctx)[:1]]
        options = [_show_fix(f) for f in fixes] + [f"a data-parallel size that divides {mini * n}"]
        return Problem(f"{text}; use {', or '.join(options)}", keys, fixes[0] if fixes else None)
    # kind == "micro"
    micro, per_device = s[micro_key], mini * n // dp
    verb = "is larger than" if micro > per_device else "does not divide"
    text = (
        f"{micro_key}={micro} {verb} the per-device mini-batch of {per_device} sequences "
        f"({mini_text} x {_N}={n} / data-parallel size {dp})"
    )
    values = _working_values(s, micro_key, _divisors(per_device), failure, ctx)
    return _with_fix(text, (micro_key, mini_key, _N, _NODES, _GPUS), micro_key, values, f"use a divisor of {per_device} such as ")


def _joint_fix(s: _Sizes, role: str, mini_key: str, failure: tuple[str, str], ctx: _Context) -> dict | None:
    """When no single key can change: the mini-batch with the micro-batch; failing that, the
    train batch too. Mini-batch sizes nearest the current one first."""
    train, n, dp, micro_key = s[_TRAIN], s[_N], _dp(s, role), _MICRO[role]

    def with_micro(fix: dict[str, int]) -> dict[str, int]:
        micro, per_device = s[micro_key], fix[mini_key] * n // dp
        if micro is not None and per_device % micro:
            fix[micro_key] = max(d for d in _divisors(per_device) if d <= micro)
        return fix

    def nearest_first(values: Any) -> list[int]:
        return sorted(values, key=lambda v: (abs(v - s[mini_key]), v))

    step = dp // math.gcd(n, dp)  # mini-batches that dp can split are multiples of this
    options = [with_micro({mini_key: m}) for m in nearest_first(_divisors(train)) if m % step == 0]
    options += [
        with_micro({_TRAIN: max(m, round(train / m) * m), mini_key: m})
        for m in nearest_first(range(step, 4 * max(train, s[mini_key]) + 1, step))[:256]
    ]
    options = [{k: v for k, v in fix.items() if v != s[k]} for fix in options]
    return next((fix for fix in options if fix and _removes(s, fix, failure, ctx)), None)


def _show_fix(fix: dict[str, Any]) -> str:
    return " and ".join(f"{k}={show(v)}" for k, v in fix.items())


def _with_fix(text: str, keys: tuple[str, ...], key: str, values: list[int], lead: str) -> Problem:
    if not values:  # only with other problems present; fix those first
        return Problem(f"{text}; change several of {', '.join(keys)} together", keys)
    return Problem(f"{text}; {lead}{' or '.join(map(str, values))}", keys, {key: values[0]})


# --------------------------------------------------------------------------- dpo / kto / sft
# No generation: a step is data.train_batch_size rows (pairs for DPO, examples for KTO/SFT), one
# optimizer step, split into micro-batches of ppo_micro_batch_size_per_gpu rows per device. The
# RL plan covers this with rollout.n = 1, one mini-batch of the whole step and one epoch.


def _as_offline_plan(r: Config) -> None:
    a = r.actor_rollout_ref
    a.rollout.n = 1
    a.actor.ppo_mini_batch_size = r.data.train_batch_size
    a.actor.ppo_epochs = 1


def _offline_batch_problems(cfg: Config) -> list[Problem]:
    train, micro_key = cfg.data.train_batch_size, _MICRO["actor"]
    micro, nodes, gpus = (
        _get(cfg, micro_key),
        cfg.trainer.nnodes,
        cfg.resource_pool.actor_rollout_ref or cfg.trainer.n_gpus_per_node,
    )
    dp, rows = nodes * gpus, {"dpo": "pairs", "kto": "examples", "sft": "examples", "rm": "pairs"}[cfg.algorithm.name]
    if train % dp:
        fixes = [v for v in range(train - train % dp, train + dp + 1, dp) if v > 0]
        return [
            Problem(
                f"{_TRAIN}={train} {rows} per step cannot be split evenly over data-parallel size {dp} "
                f"({_NODES}={nodes} x {_GPUS}={gpus}); use a multiple of {dp} such as {_TRAIN}={fixes[0]}",
                (_TRAIN, _NODES, _GPUS),
                {_TRAIN: fixes[0]},
            )
        ]
    per_device = train // dp
    if micro is not None and per_device % micro:
        verb = "is larger than" if micro > per_device else "does not divide"
        values = [d for d in _divisors(per_device) if d < micro][-1:] + [d for d in _divisors(per_device) if d > micro][:1]
        return [
            _with_fix(
                f"{micro_key}={micro} {verb} the {per_device} {rows} one device trains on per step "
                f"({_TRAIN}={train} / data-parallel size {dp}; algorithm.name={cfg.algorithm.name} makes one optimizer "
                f"step per {_TRAIN} rows)",
                (micro_key, _TRAIN, _NODES, _GPUS),
                micro_key,
                values,
                f"use a divisor of {per_device} such as ",
            )
        ]
    return []


def _offline_problems(cfg: Config) -> list[Problem]:
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


def _async_problems(cfg: Config) -> list[Problem]:
    """trainer.mode one_step_off / async: the RL loop only, and a loss that corrects the staleness."""
    t, rc = cfg.trainer, cfg.algorithm.rollout_correction
    if t.mode == "sync":
        return []
    out = []
    if cfg.algorithm.name != "rl":
        out.append(_suggest("trainer.mode", t.mode, f"runs the RL loop only (algorithm.name={cfg.algorithm.name})", "sync"))
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
