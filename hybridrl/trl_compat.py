"""TRL's GRPO vocabulary for the Python API: its argument names, its dataset rows, its reward functions.

`hybridrl.grpo(model, dataset, reward_funcs, num_generations=8, learning_rate=1e-6, ...)` takes what a
`GRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=...)` script has (docs/coming_from_trl.md):

- names of GRPOConfig whose meaning is hybridrl's too are aliases of config keys (`TRL_ALIASES`);
  `per_device_train_batch_size` (completions) with `gradient_accumulation_steps` and
  `num_generations` becomes prompts per step (`data.train_batch_size`) and one optimizer step per
  generation batch, as GRPOTrainer does by default;
- a name whose meaning differs is refused with its translation (`TRL_REFUSED`);
- rows `{"prompt": text or chat messages, <any columns>}` and TRL-form reward functions go through
  `hybridrl/rewards/trl.py`: the columns reach the functions untouched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# TRL name -> (config key, how the value is translated or None). Same meaning in both.
TRL_ALIASES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "num_generations": ("actor_rollout_ref.rollout.n", None),
    "learning_rate": ("actor_rollout_ref.actor.optim.lr", None),
    "weight_decay": ("actor_rollout_ref.actor.optim.weight_decay", None),
    "warmup_ratio": ("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", None),
    "warmup_steps": ("actor_rollout_ref.actor.optim.lr_warmup_steps", None),
    "max_grad_norm": ("actor_rollout_ref.actor.grad_clip", None),
    "max_steps": ("trainer.total_training_steps", None),
    "num_train_epochs": ("trainer.total_epochs", int),
    "max_completion_length": ("data.max_response_length", None),
    "num_iterations": ("actor_rollout_ref.actor.ppo_epochs", None),
    "epsilon": ("actor_rollout_ref.actor.clip_ratio", None),
    "epsilon_high": ("actor_rollout_ref.actor.clip_ratio_high", None),
    "top_p": ("actor_rollout_ref.rollout.top_p", None),
    "top_k": ("actor_rollout_ref.rollout.top_k", lambda k: -1 if k in (None, 0) else k),
    "gradient_checkpointing": ("actor_rollout_ref.model.enable_gradient_checkpointing", None),
    "save_steps": ("trainer.save_freq", None),
    "eval_steps": ("trainer.test_freq", None),
    "use_vllm": ("actor_rollout_ref.rollout.name", lambda on: "vllm" if on else "native"),
    "vllm_gpu_memory_utilization": ("actor_rollout_ref.rollout.gpu_memory_utilization", None),
}

# GRPOConfig.loss_type -> actor.loss_agg_mode (how per-token losses become one number).
LOSS_TYPES = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean", "dr_grpo": "seq-mean-token-sum-norm"}

# TRL names hybridrl does not take as they are: why, and what to write.
TRL_REFUSED = {
    "generation_batch_size": "is in completions; pass batch_size=generation_batch_size // num_generations (prompts per step)",
    "steps_per_generation": "pass mini_batch_size=batch_size // steps_per_generation (prompts per optimizer step)",
    "logging_steps": "hybridrl logs every step's metrics (metrics.jsonl, the console, trainer.logger); drop it",
    "bf16": "precision follows the device (bf16 on GPUs that have it, fp32 on CPU); drop it",
    "fp16": "precision follows the device (bf16 on GPUs that have it, fp32 on CPU); drop it",
    "remove_unused_columns": "every column reaches the reward functions that name it (or take **kwargs); drop it",
    "per_device_eval_batch_size": "validation batches are sized by the engine; drop it",
    "model_init_kwargs": "load the model yourself (from_pretrained(..., **kwargs)) and pass the object",
    "lr_scheduler_type": "hybridrl's schedules are constant and cosine: "
    "**{'actor_rollout_ref.actor.optim.lr_scheduler_type': 'cosine'}",
    "logging_dir": "TensorBoard events go under the run directory (output_dir); drop it",
}


class TRLSettingError(ValueError):
    pass


def translate(settings: dict[str, Any], algorithm: str) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """Split `grpo(**settings)`: (hybridrl settings left, config overrides from TRL names, API-level values).

    API-level values: reward_weights, callbacks, and GRPOTrainer's reward_funcs, train_dataset,
    eval_dataset and processing_class (the same as `reward`, `data`, `val_data` and `tokenizer`).

    >>> rest, overrides, api = translate({"num_generations": 4, "beta": 0.04, "steps": 3}, "grpo")
    >>> rest
    {'steps': 3}
    >>> overrides  # doctest: +NORMALIZE_WHITESPACE
    ['actor_rollout_ref.rollout.n=4', 'actor_rollout_ref.actor.kl_loss_coef=0.04',
     'actor_rollout_ref.actor.use_kl_loss=true']
    """
    rest, out, api = dict(settings), [], {}

    def put(key: str, value: Any) -> None:
        out.append(f"{key}={json.dumps(value)}")

    for name in [n for n in rest if n in TRL_REFUSED]:
        raise TRLSettingError(f"{name}={rest[name]!r} is TRL's: {TRL_REFUSED[name]}")
    for name in ("reward_weights", "callbacks", "reward_funcs", "train_dataset", "eval_dataset", "processing_class"):
        if name in rest:
            api[name] = rest.pop(name)
    for name in [n for n in rest if n in TRL_ALIASES]:
        key, convert = TRL_ALIASES[name]
        value = rest.pop(name)
        put(key, convert(value) if convert else value)
    if "beta" in rest:  # GRPOConfig.beta: the KL coefficient (0 = no reference model), never the DPO beta
        beta = rest.pop("beta")
        if algorithm != "grpo":
            raise TRLSettingError(
                f"beta={beta!r}: in a {algorithm} run, give the KL coefficient as kl_coef= (the actor's KL loss) or "
                f"**{{'algorithm.kl_ctrl.kl_coef': ...}} (KL in the reward); preference.beta is DPO's"
            )
        put("actor_rollout_ref.actor.kl_loss_coef", beta)
        put("actor_rollout_ref.actor.use_kl_loss", bool(beta))
    if "loss_type" in rest:
        kind = rest.pop("loss_type")
        if kind not in LOSS_TYPES:
            raise TRLSettingError(f"loss_type={kind!r}: TRL's loss types hybridrl maps are {', '.join(LOSS_TYPES)}")
        put("actor_rollout_ref.actor.loss_agg_mode", LOSS_TYPES[kind])
    if "scale_rewards" in rest:
        scale = rest.pop("scale_rewards")
        if scale not in (True, False, "group", "none"):
            raise TRLSettingError(
                f"scale_rewards={scale!r}: hybridrl scales advantages by the group's std (True/'group') or not "
                f"(False/'none'): algorithm.norm_adv_by_std_in_grpo"
            )
        put("algorithm.norm_adv_by_std_in_grpo", scale in (True, "group"))
    if "report_to" in rest:
        to = rest.pop("report_to")
        to = [to] if isinstance(to, str) else list(to or [])
        put("trainer.logger", ["console", "jsonl"] + [t for t in to if t not in ("none", "all")])
    if "per_device_train_batch_size" in rest or "gradient_accumulation_steps" in rest:
        batch = _batch_in_prompts(rest, out)
        put("data.train_batch_size", batch)
        put("actor_rollout_ref.actor.ppo_mini_batch_size", batch)  # one optimizer step per generation batch
    return rest, out, api


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
        raise TRLSettingError(
            f"per_device_train_batch_size={per_device} x gradient_accumulation_steps={accumulation} x {devices} device(s) = "
            f"{completions} completions is not a multiple of num_generations={n}; make it one (TRL requires it too)"
        )
    out.append(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_device}")
    return completions // n


def adapt_reward(reward: Any, weights: Sequence[float] | None, train_data: Any, val_data: Any, what: str = "reward_fn"):
    """(reward function for the trainer, train rows, val rows): TRL-form functions (one or a list) become
    one `TRLRewards` and the rows carry their columns to it; a verl-form function is kept, its rows
    get a `data_source` when they lack one. Raises ValueError with the one line to show."""
    from hybridrl.rewards.trl import TRLRewards, is_trl_reward

    if reward is None:
        if weights is not None:
            raise ValueError("reward_weights without reward functions; pass reward_funcs=[f, g] with them")
        return None, train_data, val_data
    funcs = list(reward) if isinstance(reward, (list, tuple)) else [reward]
    trl = [f for f in funcs if is_trl_reward(f)]
    if len(funcs) == 1 and not trl:  # verl's form: (data_source, solution_str, ground_truth, extra_info)
        if weights is not None:
            raise ValueError("reward_weights weighs several TRL-form functions f(prompts, completions, **columns)")
        return funcs[0], _with_source(train_data, "train_data", funcs[0]), _with_source(val_data, "val_data", funcs[0])
    if len(trl) != len(funcs):
        names = [getattr(f, "__name__", "?") for f in funcs if f not in trl]
        raise ValueError(
            f"{what}: several reward functions must all take TRL's form f(prompts, completions, **columns); "
            f"{', '.join(names)} do(es) not"
        )
    rewards = TRLRewards(funcs, weights)
    converted = []
    for name, data in (("train_data", train_data), ("val_data", val_data)):
        rows = None if data is None else [_trl_row(r, name, i) for i, r in enumerate(_rows_of(data, name))]
        if rows is not None:
            rewards.check_columns({k for r in rows for k in r["extra_info"]["trl"]["columns"]}, name)
        converted.append(rows)
    return rewards, converted[0], converted[1]


def _trl_row(row: Any, name: str, i: int) -> dict:
    from hybridrl.rewards.trl import trl_row

    if not isinstance(row, Mapping) or "prompt" not in row:
        got = sorted(row) if isinstance(row, Mapping) else type(row).__name__
        raise ValueError(f"{name}, row {i}: a row needs a 'prompt' column (text or chat messages); got {got}")
    return trl_row(row)


def _rows_of(data: Any, name: str) -> list:
    from hybridrl.api import _is_data_path, _rows

    if _is_data_path(data):
        from hybridrl.data.converters import read_rows

        paths = [data] if isinstance(data, (str, os.PathLike)) else list(data)
        return [r for p in paths for r in read_rows(os.fspath(p))]
    return _rows(data, name)


# verl's row fields: what a verl-form reward function can be given (hybridrl/data/dataset.py).
_VERL_FIELDS = {"prompt", "data_source", "reward_model", "extra_info", "ability", "agent_name", "tools_kwargs"}


def _with_source(data: Any, name: str, fn: Any) -> Any:
    """Rows (objects, not files) for a verl-form function: a default data_source where a row has none,
    and a one-line error for columns the function would never see."""
    from hybridrl.api import _is_data_path, _rows

    if data is None or _is_data_path(data):
        return data
    rows = _rows(data, name)
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            return data  # the data layer's own check names the row
        unseen = sorted(set(row) - _VERL_FIELDS)
        if unseen and "reward_model" not in row and "extra_info" not in row:
            fname = getattr(fn, "__name__", "reward_fn")
            raise ValueError(
                f"{name}, row {i}: column(s) {unseen} would never reach {fname}(data_source, solution_str, "
                f"ground_truth, extra_info); write it TRL's way, f(prompts, completions, {', '.join(unseen)}, **kw), "
                f"or put the answer under reward_model.ground_truth"
            )
        out.append(row if row.get("data_source") else {**row, "data_source": "reward_fn"})
    return out


def mini_batch_default(config: Any, overrides: list[str]) -> list[str]:
    """`grpo(batch_size=8)`: the mini-batch follows the batch size given, unless a mini-batch size is given
    too (by keyword, override or the config). Without it the config's default (64) would exceed the batch.

    >>> mini_batch_default(None, ["data.train_batch_size=8"])
    ['actor_rollout_ref.actor.ppo_mini_batch_size=8']
    """
    mini = "actor_rollout_ref.actor.ppo_mini_batch_size="
    batch = [o.split("=", 1)[1] for o in overrides if o.startswith("data.train_batch_size=")]
    if not batch or any(o.startswith(mini) for o in overrides):
        return []
    if isinstance(config, Mapping):
        if (config.get("actor_rollout_ref") or {}).get("actor", {}).get("ppo_mini_batch_size") is not None:
            return []
    elif config is not None:
        return []  # a YAML file or a Config: its mini-batch size stands
    return [mini + batch[-1]]
