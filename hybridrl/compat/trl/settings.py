"""TRL's GRPOConfig / GRPOTrainer argument names, in hybridrl's terms.

`hybridrl.grpo(model, dataset, reward_funcs, num_generations=8, learning_rate=1e-6, ...)` takes what a
`GRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=...)` script has (docs/coming_from_trl.md):

- a name whose meaning is hybridrl's too is an alias of a config key (`TRL_ALIASES`);
  `per_device_train_batch_size` (completions) with `gradient_accumulation_steps` and
  `num_generations` becomes prompts per step (`data.train_batch_size`) and one optimizer step per
  generation batch, as GRPOTrainer does by default;
- a name that changes nothing here (logging, precision, data-loader workers) is accepted and listed
  in one notice (`TRL_NO_EFFECT`);
- a name hybridrl spells otherwise or has no counterpart for is refused with what to write
  (`TRL_REFUSED`), unless it holds the value that changes nothing.

`translate` reports every refused name at once, never one per run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# TRL name -> (config key, how the value is translated or None). Same meaning in both. A translation
# raises ValueError for a value it has no counterpart for.
TRL_ALIASES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "num_generations": ("actor_rollout_ref.rollout.n", None),
    "num_generations_eval": ("actor_rollout_ref.rollout.val_kwargs.n", None),
    "learning_rate": ("actor_rollout_ref.actor.optim.lr", None),
    "weight_decay": ("actor_rollout_ref.actor.optim.weight_decay", None),
    "warmup_ratio": ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", None),
    "warmup_steps": ("actor_rollout_ref.actor.optim.lr_warmup_steps", None),
    "max_grad_norm": ("actor_rollout_ref.actor.grad_clip", None),
    "max_steps": ("trainer.total_training_steps", lambda s: None if s is not None and s < 0 else s),
    "num_train_epochs": ("trainer.total_epochs", int),
    "max_completion_length": ("data.max_response_length", None),
    "max_prompt_length": ("data.max_prompt_length", None),
    "num_iterations": ("actor_rollout_ref.actor.ppo_epochs", None),
    "epsilon": ("actor_rollout_ref.actor.clip_ratio", None),
    "epsilon_high": ("actor_rollout_ref.actor.clip_ratio_high", None),
    "entropy_coef": ("actor_rollout_ref.actor.entropy_coeff", None),
    "temperature": ("actor_rollout_ref.rollout.temperature", None),
    "top_p": ("actor_rollout_ref.rollout.top_p", None),
    "top_k": ("actor_rollout_ref.rollout.top_k", lambda k: -1 if k in (None, 0) else k),
    "gradient_checkpointing": ("actor_rollout_ref.model.enable_gradient_checkpointing", None),
    "output_dir": ("trainer.default_local_dir", str),
    "run_name": ("trainer.experiment_name", None),
    "seed": ("trainer.seed", None),
    "data_seed": ("data.seed", None),
    "shuffle_dataset": ("data.shuffle", None),
    "save_steps": ("trainer.save_freq", None),
    "save_total_limit": ("trainer.max_ckpt_to_keep", None),
    "eval_steps": ("trainer.test_freq", None),
    "eval_on_start": ("trainer.val_before_train", None),
    "overwrite_output_dir": ("trainer.overwrite", None),
    "use_cpu": ("trainer.device", lambda on: "cpu" if on else "auto"),
    "use_vllm": ("actor_rollout_ref.rollout.name", lambda on: "vllm" if on else "native"),
    "vllm_gpu_memory_utilization": ("actor_rollout_ref.rollout.gpu_memory_utilization", None),
    "vllm_tensor_parallel_size": ("actor_rollout_ref.rollout.tensor_model_parallel_size", None),
    "importance_sampling_level": (
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        lambda level: _choice(
            level, {"token": "vanilla", "sequence": "gspo"}, "token-level ratios (vanilla) or sequence-level (gspo)"
        ),
    ),
    "lr_scheduler_type": (
        "actor_rollout_ref.actor.optim.lr_scheduler_type",
        lambda kind: _choice(
            kind,
            {"constant": "constant", "constant_with_warmup": "constant", "cosine": "cosine"},
            "constant and cosine, after warm-up (warmup_ratio / warmup_steps)",
        ),
    ),
}

# GRPOConfig.loss_type -> actor.loss_agg_mode (how per-token losses become one number).
LOSS_TYPES = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}

_LOGGED = "hybridrl logs every step's metrics (metrics.jsonl, the console, trainer.logger)"
_PRECISION = "precision follows the device (bf16 autocast on GPUs that have it, fp32 on CPU)"
_LOADER = "every row is tokenized once before training; there are no data-loader workers"
_WORKERS = "hybridrl starts and connects its own worker processes (n_gpus=N)"
_SPEED = "speed or memory only, same results"
_SAMPLES = "a few generations per step go to samples.jsonl in the run directory (trainer.log_samples)"

# TRL names that change nothing here: accepted, and listed in one notice at start.
TRL_NO_EFFECT: dict[str, str] = {
    **dict.fromkeys(("logging_steps", "logging_strategy", "logging_first_step", "logging_nan_inf_filter"), _LOGGED),
    "logging_dir": "TensorBoard events go under the run directory (output_dir)",
    **dict.fromkeys(("bf16", "fp16", "tf32", "half_precision_backend", "bf16_full_eval", "fp16_full_eval"), _PRECISION),
    **dict.fromkeys(
        (
            "dataloader_num_workers",
            "dataloader_pin_memory",
            "dataloader_persistent_workers",
            "dataloader_prefetch_factor",
            "dataloader_drop_last",
        ),
        _LOADER,
    ),
    "remove_unused_columns": "every column reaches the reward functions that name it (or take **kwargs)",
    "per_device_eval_batch_size": "validation batches are sized by the engine",
    "disable_tqdm": "hybridrl prints one line per step",
    **dict.fromkeys(("log_completions", "num_completions_to_print", "log_unique_prompts", "wandb_log_unique_prompts"), _SAMPLES),
    **dict.fromkeys(("ddp_find_unused_parameters", "ddp_timeout", "ddp_backend", "local_rank"), _WORKERS),
    **dict.fromkeys(
        ("torch_compile", "use_liger_kernel", "use_liger_loss", "gradient_checkpointing_kwargs", "ds3_gather_for_generation"),
        _SPEED,
    ),
    **dict.fromkeys(
        ("vllm_mode", "vllm_server_host", "vllm_server_port", "vllm_server_base_url", "vllm_server_timeout"),
        "the rollout engine runs inside hybridrl's own workers (no vLLM server)",
    ),
}


class Refusal(NamedTuple):
    spelling: str  # what to write in hybridrl, or that it has no counterpart
    harmless: tuple = ()  # values that change nothing: accepted without a word


_HUB = (
    "hybridrl does not upload: save the model with result.save(dir) and upload that directory (huggingface_hub's upload_folder)"
)
_BEST = (
    "hybridrl keeps the checkpoints (save_total_limit=N keeps the newest N) and returns the last; "
    "callbacks=[hybridrl.EarlyStopping(metric, patience)] stops when a metric stops improving"
)
_SAMPLING = "hybridrl samples with temperature, top_p and top_k only; it has no counterpart"
_SYNC_REF = "hybridrl's reference model stays the initial policy (no TR-DPO syncing); it has no counterpart"

# TRL names hybridrl does not take as they are: what to write instead.
TRL_REFUSED: dict[str, Refusal] = {
    "generation_batch_size": Refusal(
        "is in completions; pass batch_size=generation_batch_size // num_generations (prompts per step)"
    ),
    "steps_per_generation": Refusal("pass mini_batch_size=batch_size // steps_per_generation (prompts per optimizer step)"),
    "model_init_kwargs": Refusal("load the model yourself (from_pretrained(..., **kwargs)) and pass the object", (None, {})),
    "save_strategy": Refusal(
        "hybridrl saves a checkpoint every save_steps=N steps (trainer.save_freq) and at the last step; drop it", ("steps",)
    ),
    "eval_strategy": Refusal(
        "hybridrl validates on eval_dataset every eval_steps=N steps (trainer.test_freq), before the first step "
        "(eval_on_start) and at the last; drop it, or drop eval_dataset to validate nothing",
        ("steps",),
    ),
    "push_to_hub": Refusal(_HUB, (False, None)),
    "hub_model_id": Refusal(_HUB, (None,)),
    "hub_strategy": Refusal(_HUB, ("every_save",)),
    "hub_token": Refusal(_HUB, (None,)),
    "hub_private_repo": Refusal(_HUB, (None, False)),
    "load_best_model_at_end": Refusal(_BEST, (False, None)),
    "metric_for_best_model": Refusal(_BEST, (None,)),
    "greater_is_better": Refusal(_BEST, (None,)),
    "resume_from_checkpoint": Refusal(
        "a run resumes from its output_dir's last checkpoint by itself (trainer.resume_mode=auto); from another one: "
        "**{'trainer.resume_mode': 'resume_path', 'trainer.resume_from_path': path}",
        (None, False),
    ),
    "optim": Refusal(
        "hybridrl trains with AdamW (learning_rate, weight_decay, adam_beta1, adam_beta2); it has no other optimizer",
        ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw"),
    ),
    "adam_epsilon": Refusal("hybridrl's AdamW uses eps=1e-8; it has no key for another", (1e-8,)),
    **dict.fromkeys(
        ("deepspeed", "fsdp", "fsdp_config"),
        Refusal(
            "hybridrl shards the model over its workers with FSDP2 itself: n_gpus=N (docs/distributed.md)", (None, "", [], {})
        ),
    ),
    "repetition_penalty": Refusal(_SAMPLING, (1.0, None)),
    "min_p": Refusal(_SAMPLING, (None, 0.0)),
    "generation_kwargs": Refusal(_SAMPLING, (None, {})),
    "mask_truncated_completions": Refusal(
        "hybridrl has no such mask: raise max_completion_length, or shape overlong responses with "
        "**{'reward_model.overlong_buffer.enable': True, ...} (DAPO)",
        (False,),
    ),
    "sync_ref_model": Refusal(_SYNC_REF, (False,)),
    "ref_model_mixup_alpha": Refusal(_SYNC_REF, (0.6,)),
    "ref_model_sync_steps": Refusal(_SYNC_REF, (512,)),
    "delta": Refusal(
        "hybridrl has no upper bound on the ratio of negative-advantage tokens of this kind "
        "(actor_rollout_ref.actor.clip_ratio_c is dual-clip PPO's); it has no counterpart",
        (None,),
    ),
    "top_entropy_quantile": Refusal("hybridrl trains on every response token; it has no counterpart", (1.0,)),
    # GRPOTrainer's own arguments
    "peft_config": Refusal(
        "LoRA is a config: **{'actor_rollout_ref.model.lora_rank': r, 'actor_rollout_ref.model.lora_alpha': alpha, "
        "'actor_rollout_ref.model.target_modules': 'all-linear'}",
        (None,),
    ),
    "optimizers": Refusal("hybridrl builds AdamW itself from learning_rate, weight_decay, adam_beta1/2", (None, (None, None))),
    "reward_processing_classes": Refusal(
        "a reward model brings its tokenizer: RLTrainer(reward_models=[(model, tokenizer)]) (docs/reward_models.md)", (None,)
    ),
}
TRL_REFUSED["evaluation_strategy"] = TRL_REFUSED["eval_strategy"]  # its name before transformers 4.46

# GRPOTrainer's arguments that are the API's own (the same as `reward`, `data`, `val_data`, `tokenizer`).
API_NAMES = ("reward_weights", "callbacks", "reward_funcs", "train_dataset", "eval_dataset", "processing_class")


@dataclass
class Translation:
    """What `translate` made of `grpo(**settings)`."""

    rest: dict[str, Any]  # hybridrl's own names, left for the API (short keys, config keys)
    overrides: list[str] = field(default_factory=list)  # config overrides from TRL names
    api: dict[str, Any] = field(default_factory=dict)  # API-level values (API_NAMES)
    notices: list[str] = field(default_factory=list)  # one line each
    problems: list[str] = field(default_factory=list)  # refused names, all of them


def translate(settings: dict[str, Any], algorithm: str) -> Translation:
    """Split `grpo(**settings)` into hybridrl's names, config overrides from TRL's, API-level values,
    notices and problems (every refused name, each with what to write).

    >>> t = translate({"num_generations": 4, "beta": 0.04, "steps": 3, "logging_steps": 5}, "grpo")
    >>> t.rest, t.problems
    ({'steps': 3}, [])
    >>> t.overrides  # doctest: +NORMALIZE_WHITESPACE
    ['actor_rollout_ref.rollout.n=4', 'actor_rollout_ref.actor.kl_loss_coef=0.04',
     'actor_rollout_ref.actor.use_kl_loss=true']
    >>> translate({"push_to_hub": True, "save_strategy": "epoch"}, "grpo").problems  # doctest: +ELLIPSIS
    ["push_to_hub=True is TRL's: hybridrl does not upload: ...", "save_strategy='epoch' is TRL's: hybridrl saves ..."]
    """
    out = Translation(dict(settings))
    rest = out.rest

    def put(key: str, value: Any) -> None:
        out.overrides.append(f"{key}={json.dumps(value)}")

    for name in [n for n in rest if n in TRL_REFUSED]:
        value = rest.pop(name)
        if not _harmless(value, TRL_REFUSED[name].harmless):
            out.problems.append(f"{name}={value!r} is TRL's: {TRL_REFUSED[name].spelling}")
    quiet = {name: rest.pop(name) for name in [n for n in rest if n in TRL_NO_EFFECT]}
    if quiet:
        why: dict[str, list[str]] = {}
        for name in quiet:
            why.setdefault(TRL_NO_EFFECT[name], []).append(name)
        out.notices.append("TRL's names that change nothing here: " + "; ".join(f"{', '.join(n)} ({w})" for w, n in why.items()))
    for name in API_NAMES:
        if name in rest:
            out.api[name] = rest.pop(name)
    for name in [n for n in rest if n in TRL_ALIASES]:
        key, convert = TRL_ALIASES[name]
        value = rest.pop(name)
        try:
            put(key, convert(value) if convert else value)
        except (ValueError, TypeError) as e:
            out.problems.append(f"{name}={value!r} is TRL's: {e}")
    if "adam_beta1" in rest or "adam_beta2" in rest:  # TransformersArguments' defaults
        put("actor_rollout_ref.actor.optim.betas", [rest.pop("adam_beta1", 0.9), rest.pop("adam_beta2", 0.999)])
    if "beta" in rest:  # GRPOConfig.beta: the KL coefficient (0 = no reference model), never the DPO beta
        beta = rest.pop("beta")
        if algorithm != "grpo":
            out.problems.append(
                f"beta={beta!r}: in a {algorithm} run, give the KL coefficient as kl_coef= (the actor's KL loss) or "
                f"**{{'algorithm.kl_ctrl.kl_coef': ...}} (KL in the reward); preference.beta is DPO's"
            )
        else:
            put("actor_rollout_ref.actor.kl_loss_coef", beta)
            put("actor_rollout_ref.actor.use_kl_loss", bool(beta))
    if "loss_type" in rest:
        kind = rest.pop("loss_type")
        if kind in LOSS_TYPES:
            put("actor_rollout_ref.actor.loss_agg_mode", LOSS_TYPES[kind])
        else:
            out.problems.append(f"loss_type={kind!r}: TRL's loss types hybridrl maps are {', '.join(LOSS_TYPES)}")
    if "scale_rewards" in rest:
        scale = rest.pop("scale_rewards")
        if scale in (True, False, "group", "none"):
            put("algorithm.norm_adv_by_std_in_grpo", scale in (True, "group"))
        else:
            out.problems.append(
                f"scale_rewards={scale!r}: hybridrl scales advantages by the group's std (True/'group') or not "
                f"(False/'none'): algorithm.norm_adv_by_std_in_grpo"
            )
    if "report_to" in rest:
        to = rest.pop("report_to")
        to = [to] if isinstance(to, str) else list(to or [])
        put("trainer.logger", ["console", "jsonl"] + [t for t in to if t not in ("none", "all")])
    if "per_device_train_batch_size" in rest or "gradient_accumulation_steps" in rest:
        try:
            batch = _batch_in_prompts(rest, out.overrides)
        except ValueError as e:
            out.problems.append(str(e))
        else:
            put("data.train_batch_size", batch)
            put("actor_rollout_ref.actor.ppo_mini_batch_size", batch)  # one optimizer step per generation batch
    return out


def _harmless(value: Any, harmless: tuple) -> bool:
    try:
        return any(value == h and type(value) is not bool or value is h for h in harmless)
    except Exception:  # a value that does not compare (an array): not harmless
        return False


def _choice(value: Any, table: dict[str, str], what: str) -> str:
    if value not in table:
        raise ValueError(f"hybridrl has {what}")
    return table[value]


def _batch_in_prompts(rest: dict, out: list[str]) -> int:
    """TRL's completions per optimizer step (per device x accumulation x devices) as prompts per step."""
    per_device = int(rest.pop("per_device_train_batch_size", 8))  # GRPOConfig's defaults
    accumulation = int(rest.pop("gradient_accumulation_steps", 1))
    n = next((json.loads(o.split("=", 1)[1]) for o in out if o.startswith("actor_rollout_ref.rollout.n=")), None)
    n = rest.get("rollout_n", n)
    if n is None:  # GRPOConfig's num_generations default, not grpo()'s 4: the completions add up as in TRL
        n = 8
        out.append("actor_rollout_ref.rollout.n=8")
    devices = int(rest.get("n_gpus", 1))
    completions = per_device * accumulation * devices
    if completions % n:
        raise ValueError(
            f"per_device_train_batch_size={per_device} x gradient_accumulation_steps={accumulation} x {devices} device(s) = "
            f"{completions} completions is not a multiple of num_generations={n}; make it one (TRL requires it too)"
        )
    out.append(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_device}")
    return completions // n
