"""verl's PPO config keys that are not in hybridrl's schema, and what each becomes here.

A verl launch script sets keys from verl's whole config tree (verl/trainer/config/ppo_trainer.yaml
and its sub-configs). Every such key is one of:

- in our schema (`schema.py`): used as is;
- RENAMED: the same meaning under another name here (`trainer.max_actor_ckpt_to_keep`);
- GLOBAL_MICRO: verl's deprecated global micro-batch sizes, divided by the data-parallel size as
  verl's fsdp_workers.py does;
- IGNORED: tunes an engine or backend hybridrl does not use (vLLM/SGLang/TRT-LLM, Megatron,
  shm loading, profiler back-ends, ...): accepted with any value and listed once in one notice;
- NEEDS: changes the result, and hybridrl cannot honour it: accepted at the values that leave the
  result as ours is (verl's default), an error naming what is missing otherwise; a key that is
  also in our schema is ours (the schema always wins);

`translate(tree)` applies all of this to a raw config tree before it is typed; it is data-driven
so that docs/verl.md and the tests read the same tables.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hybridrl.config.schema import show
from hybridrl.config.tree import get, leaves, pop, put

_ARR, _A, _R, _REF, _M = (
    "actor_rollout_ref",
    "actor_rollout_ref.actor",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.model",
)


# --------------------------------------------------------------------------- ignored
# pattern -> why it has no effect here (the group shown in the notice). `*` matches across dots.

_ENGINE = "vLLM/SGLang/TRT-LLM engine knob; hybridrl's own engine sizes itself"
_MEGATRON = "Megatron-only"
_PROFILER = "profiler back-end (hybridrl profiles with torch.profiler: trainer.profile_steps)"
_MEMORY = "memory or speed only, same results"
_SHM = "shm model loading"
_VISION = "multimodal only"
_DERIVED = "verl fills it from other keys; hybridrl does the same"
_RM_OFF = "reward-model worker option hybridrl does not use (memory or speed only, or verl's reward loop)"
_CKPT = "checkpoint contents (hybridrl always saves model, optimizer and the rest)"
_RAY = "Ray/cluster plumbing"

IGNORED: dict[str, str] = {
    # rollout engine knobs
    **{
        f"{_R}.{k}": _ENGINE
        for k in (
            "mode",
            "dtype",
            "cudagraph_capture_sizes",
            "data_parallel_size",
            "expert_parallel_size",
            "pipeline_model_parallel_size",
            "max_model_len",
            "logprobs_mode",
            "scheduling_policy",
            "load_format",
            "disable_log_stats",
            "multi_stage_wake_up",
            "engine_kwargs",
            "engine_kwargs.*",
            "checkpoint_engine.*",
            "skip_tokenizer_init",
            "layered_summon",
            "calculate_log_probs",
            "agent.num_workers",
            "trace.*",
            "prometheus.*",
            "profiler.*",
            "quantization_config_file",
            "skip_dump_dir",
        )
    },
    **{f"{_R}.{k}": _DERIVED for k in ("prompt_length", "response_length")},
    # verl's multi-turn knobs for SGLang's tokenization; hybridrl never re-tokenizes the model's tokens
    **{
        f"{_R}.multi_turn.{k}": "multi-turn tokenization check; hybridrl keeps the sampled token ids (token in, token out)"
        for k in ("use_inference_chat_template", "tokenization_sanity_check_mode", "num_repeat_rollouts")
    },
    f"{_R}.agent.*": "verl's agent-loop worker plumbing; hybridrl's agent loop runs inside the rollout engine",
    # Megatron
    "*.megatron.*": _MEGATRON,
    # FSDP knobs that shape memory, not results
    **{
        f"*fsdp_config.{k}": _MEMORY
        for k in (
            "wrap_policy.*",
            "offload_policy",
            "forward_prefetch",
            "use_orig_params",
            "entropy_from_logits_with_chunking",
            "entropy_checkpointing",
            "forward_only",
            "use_torch_compile",
            "seed",
            "full_determinism",
        )
    },
    "*fsdp_config.fsdp_size": "sharding layout only (a reward model shards over its ranks), same results",
    "*fsdp_config.model_dtype": "hybridrl keeps fp32 master weights, as verl's default model_dtype=fp32",
    "*fsdp_config.dtype": "hybridrl computes in bf16 autocast on GPUs, as verl's default dtype=bfloat16",
    "*fsdp_config.strategy": _DERIVED,
    f"{_M}.torch_dtype": "hybridrl keeps fp32 master weights with bf16 autocast, as verl's FSDP workers do",
    **{
        f"{_A}.{k}": _MEMORY
        for k in (
            "entropy_from_logits_with_chunking",
            "entropy_checkpointing",
            "use_prefix_grouper",
            "use_fused_kernels",
            "sum_pi_squared_checkpointing",
            "calculate_sum_pi_squared",
            "calculate_entropy",
        )
    },
    **{f"{_REF}.{k}": _MEMORY for k in ("entropy_from_logits_with_chunking", "entropy_checkpointing", "use_torch_compile")},
    **{
        f"{_M}.{k}": _MEMORY
        for k in ("use_liger", "use_fused_kernels", "fused_kernel_options.*", "tiled_mlp.*", "enable_activation_offload")
    },
    **{f"critic.model.{k}": _MEMORY for k in ("tiled_mlp.*", "enable_activation_offload")},
    "critic.forward_micro_batch_size": "memory only: value passes use critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size_per_gpu": "memory only: value passes use critic.ppo_micro_batch_size_per_gpu",
    f"{_ARR}.nccl_timeout": _RAY,
    # shm loading
    "*.use_shm": _SHM,
    # derived in verl from other keys
    **{f"{p}.rollout_n": _DERIVED for p in (_A, _REF, "critic")},
    f"{_A}.use_remove_padding": _DERIVED,
    "critic.model.trust_remote_code": _DERIVED,
    "critic.model.external_lib": _DERIVED,
    "*.optim.total_training_steps": _DERIVED,
    "*.optim.optimizer_impl": "torch.optim is what hybridrl uses",
    "reward_manager.name": _DERIVED,
    "reward_manager.source": _DERIVED,
    # profiling, checkpoints, seeds of data loaders
    "*.profiler.*": _PROFILER,
    "global_profiler.*": _PROFILER,
    "*.checkpoint.*": _CKPT,
    "*.data_loader_seed": "mini-batch shuffling seed (hybridrl seeds from trainer.seed)",
    # data loading plumbing
    **{
        f"data.{k}": "data loading plumbing, same rows"
        for k in (
            "return_raw_input_ids",
            "return_raw_chat",
            "return_full_prompt",
            "dataloader_num_workers",
            "validation_shuffle",
            "filter_overlong_prompts_workers",
            "trust_remote_code",
            "tool_config_path",
        )
    },
    **{f"data.{k}": _VISION for k in ("image_patch_size", "image_key", "video_key", "return_multi_modal_inputs")},
    f"{_A}.freeze_vision_tower": _VISION,
    f"{_R}.enable_rollout_routing_replay": "the native engine records the routing when actor.router_replay.mode=R3",
    f"{_A}.tau_pos": "used only by loss_mode=sapo",
    f"{_A}.tau_neg": "used only by loss_mode=sapo",
    # trainer plumbing
    "trainer.balance_batch": "reorders sequences across GPUs for load balance; the same samples are trained on",
    "trainer.esi_redundant_time": _RAY,
    "trainer.ray_wait_register_center_timeout": _RAY,
    "trainer.use_legacy_worker_impl": "verl worker implementation switch",
    "ray_kwargs.timeline_json_file": _PROFILER,
    # reward-model worker knobs of verl that hybridrl does not use (its own keys are in the schema)
    **{
        f"reward_model.{k}": _RM_OFF
        for k in (
            "model.*",
            "micro_batch_size",
            "max_length",
            "ulysses_sequence_parallel_size",
            "rollout.*",
            "use_reward_loop",
            "num_workers",
            "reward_loop_source",
            "reward_loop_module_path",
            "reward_loop_class_name",
        )
    },
    "algorithm.pf_ppo.*": "used only with algorithm.use_pf_ppo=true",
    "hydra.*": "Hydra's own settings",
    # verl's SFT trainer argv (hybridrl.sft_trainer renames its keys into ours or into sft.*)
    "sft.multiturn.*": "rows with a `messages` column are read as conversations",
    "sft.balance_dp_token": _MEMORY,
    "sft.val_files": "hybridrl's SFT has no validation pass",
    "sft.val_max_samples": "hybridrl's SFT has no validation pass",
    "sft.micro_batch_size": "verl's SFT trainer reads only data.micro_batch_size_per_gpu (default 4), as here",
}


# --------------------------------------------------------------------------- needs


class Need(NamedTuple):
    """Accepted at `ok` values only; otherwise an error saying `missing`."""

    ok: tuple  # values that leave the result as hybridrl computes it
    missing: str  # what hybridrl lacks, for the error message


NEEDS: dict[str, Need] = {
    # verl spellings of features hybridrl has under another key
    # the DAPO recipe's own section (recipe/dapo/config/dapo_trainer.yaml) spells the same as reward.*
    "reward.reward_manager.name": Need(("naive",), "this spelling of the reward manager (use reward_model.reward_manager)"),
    # features hybridrl does not have
    "*.strategy": Need(("fsdp", "fsdp2"), "the Megatron strategy (hybridrl trains with FSDP2)"),
    "*.optim.optimizer": Need(("AdamW", "adamw"), "optimizers other than AdamW"),
    "*.optim.num_cycles": Need((0.5,), "cosine schedules other than a half cycle"),
    "*.optim.override_optimizer_config": Need((None, {}), "optimizer overrides"),
    # actor.router_replay.mode is ours (schema); the reference always routes itself
    "*.router_replay.mode": Need(("disabled",), "router replay in the reference (it routes itself)"),
    "*.router_replay.*": Need((None,), "router-replay files (hybridrl replays from the batch)"),
    f"{_A}.loss_scale_factor": Need((None,), "a loss scale factor"),
    f"{_R}.ignore_eos": Need((False,), "generation past the end-of-sequence token"),
    f"{_R}.over_sample_rate": Need((0, 0.0), "over-sampled rollouts"),
    f"{_R}.skip_rollout": Need((False,), "replaying dumped rollouts"),
    f"{_R}.quantization": Need((None,), "quantized rollout"),
    f"{_R}.mtp": Need((None,), "multi-token-prediction speculative decoding"),
    f"{_M}.hf_config_path": Need((None,), "a model config from another directory"),
    f"{_M}.custom_chat_template": Need((None,), "a custom chat template"),
    f"{_M}.external_lib": Need((None,), "importing external model code"),
    f"{_M}.exclude_modules": Need((None,), "LoRA module exclusion"),
    f"{_M}.mtp.enable": Need((False,), "multi-token prediction"),
    f"{_M}.mtp.*": Need((), "multi-token prediction"),  # only with mtp.enable (refused); any value passes below
    "critic.model.override_config": Need(({},), "critic model config overrides"),
    "critic.model.lora_rank": Need((0,), "LoRA on the critic"),
    "critic.model.lora_alpha": Need((), "LoRA on the critic"),
    "critic.model.target_modules": Need((), "LoRA on the critic"),
    "critic.enable": Need((None, True), "turning the critic off apart from algorithm.adv_estimator"),
    "critic.shuffle": Need((False,), "shuffled critic mini-batches"),
    "data.tokenizer": Need((None,), "a data tokenizer apart from the model's"),
    "data.train_max_samples": Need((-1, None), "capping the training rows"),
    "data.custom_cls.*": Need((None,), "a custom dataset class"),
    "data.sampler.*": Need((None,), "a custom sampler"),
    "data.datagen.*": Need((None,), "a data generator"),
    "data.apply_chat_template_kwargs": Need(({},), "chat-template keyword arguments"),
    "data.apply_chat_template_kwargs.*": Need((), "chat-template keyword arguments"),
    "reward_manager.module.*": Need((None, "custom_reward_manager"), "a custom reward manager class"),
    "algorithm.use_pf_ppo": Need((False,), "preference-feedback PPO reweighting"),
    "trainer.val_only": Need((False,), "validation-only runs (use hybridrl eval)"),
    "trainer.default_hdfs_dir": Need((None,), "copying checkpoints to HDFS"),
    "trainer.del_local_ckpt_after_load": Need((False,), "deleting checkpoints after loading them"),
    "transfer_queue.enable": Need((False,), "verl's transfer queue"),
    # verl's fully-async recipe (trainer.mode=async with async_training.max_staleness is ours)
    "async_training.trigger_parameter_sync_step": Need((1,), "weights sent to the rollout pool only every N updates"),
}

# Keys under a NEEDS pattern with ok=() accept any value (their parent switch is what is checked).


# --------------------------------------------------------------------------- renamed and normalized

RENAMED: dict[str, str] = {
    # verl's Megatron expert parallelism: hybridrl's FSDP2 actor splits the experts the same way
    f"{_A}.megatron.expert_model_parallel_size": f"{_A}.fsdp_config.expert_parallel_size",
    f"{_R}.checkpoint_engine.update_weights_bucket_megabytes": f"{_R}.update_weights_bucket_megabytes",
    "*.optim.warmup_steps_ratio": "lr_warmup_steps_ratio",  # hybridrl's earlier spelling (not verl's)
    "*.optim.clip_grad": "../grad_clip",  # verl's new location of the role's gradient clipping
    "*.optim.warmup_style": "lr_scheduler_type",  # deprecated verl spelling
    "ray_kwargs.ray_init.address": "ray_init.address",
    "ray_kwargs.ray_init.num_cpus": "ray_init.num_cpus",
    "ray_kwargs.ray_init.*": "ray_init.kwargs.*",  # anything else goes to ray.init as is
    "global_profiler.steps": "trainer.profile_steps",
    "trainer.log_val_generations": "trainer.log_val_samples",  # validation prompts kept in samples.jsonl
    # DAPO overlong shaping as verl's recipes spell it (the reward manager's kwargs): the same keys under
    # custom_reward_function.reward_kwargs, which configure reward_model.overlong_buffer (schema.resolve)
    "reward_model.reward_kwargs.overlong_buffer_cfg.*": "custom_reward_function.reward_kwargs.overlong_buffer_cfg.*",
    "reward_model.reward_kwargs.max_resp_len": "custom_reward_function.reward_kwargs.max_resp_len",
    "reward.reward_kwargs.overlong_buffer_cfg.*": "custom_reward_function.reward_kwargs.overlong_buffer_cfg.*",
    "reward.reward_kwargs.max_resp_len": "custom_reward_function.reward_kwargs.max_resp_len",
}

# verl's deprecated global micro-batch sizes: per_gpu = global // (world // sp) (fsdp_workers.py).
GLOBAL_MICRO: dict[str, str] = {
    f"{_A}.ppo_micro_batch_size": f"{_A}.ppo_micro_batch_size_per_gpu",
    f"{_R}.log_prob_micro_batch_size": f"{_R}.log_prob_micro_batch_size_per_gpu",
    f"{_REF}.log_prob_micro_batch_size": f"{_REF}.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
}


# Defaults of verl's ppo_trainer.yaml that differ from hybridrl's own, used when no config file is
# given (`hybridrl train` with overrides only, `python -m hybridrl.main_ppo`). Deliberately not
# taken: model and data paths (verl's are placeholders; an empty one is a clear error here),
# trainer.device (verl's is cuda; auto picks cuda when there is one).
VERL_DEFAULTS: dict[str, Any] = {
    "data.train_batch_size": 1024,
    f"{_A}.ppo_mini_batch_size": 256,
    f"{_A}.clip_ratio_low": 0.2,  # verl sets both explicitly, so clip_ratio alone does not move them
    f"{_A}.clip_ratio_high": 0.2,
    f"{_M}.enable_gradient_checkpointing": True,
    "critic.model.enable_gradient_checkpointing": True,
    "critic.model.use_remove_padding": False,
    "trainer.total_epochs": 30,
    "trainer.n_gpus_per_node": 8,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.logger": ["console", "wandb"],
}

# verl's generation engines hybridrl has no adapter for: its own engine generates instead, from verl
# argv only. `vllm` is not one of them: it means the same with and without a config file (hybridrl/config/loader.py).
VERL_ENGINES = ("sglang", "trtllm")
# verl's loggers hybridrl does not have; `file` is verl's JSONL logger.
VERL_LOGGERS = {"file": "jsonl", "swanlab": None, "vemlp_wandb": None, "clearml": None, "trackio": None}


# --------------------------------------------------------------------------- translate


@dataclass
class Translation:
    """What `translate` did: the tree now holds only hybridrl keys (and unknown ones)."""

    notices: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ignored: dict[str, list[str]] = field(default_factory=dict)  # reason -> keys
    standalone: dict[str, Any] = field(default_factory=dict)  # verl's standalone-rollout keys (_standalone_rollout)


def match(path: str, table: dict[str, Any]) -> str | None:
    """The first pattern of `table` that `path` matches (exact keys first)."""
    if path in table:
        return path
    return next((p for p in table if "*" in p and fnmatch.fnmatchcase(path, p)), None)


def translate(tree: dict, known: set[str], dict_keys: set[str], defaults: dict[str, Any]) -> Translation:
    """Rewrite verl-only keys of a raw config tree in place.

    known: every key path of our schema; dict_keys: those holding free-form mappings (keys under
    them are never verl keys); defaults: our schema's default per key (for the world size).
    """
    out = Translation()
    for path, (verl_value, ours) in VALUE_FIXES.items():
        if get(tree, path, "absent") == verl_value:
            put(tree, path, ours)
    for path, value in leaves(tree):
        if path in known or any(path.startswith(d + ".") for d in dict_keys):
            continue
        _one(tree, path, value, known, out)
    _standalone_rollout(tree, defaults, out)
    _normalize_micro(tree, defaults, out)
    if out.ignored:
        groups = "; ".join(f"{', '.join(keys)} ({why})" for why, keys in out.ignored.items())
        out.notices.insert(0, f"ignored, no effect here: {groups}")
    return out


# verl's engine-config copies of a role's sequence-parallel degree: the role's own key is ours.
_SP_COPIES = {
    f"{_A}.fsdp_config.ulysses_sequence_parallel_size": f"{_A}.ulysses_sequence_parallel_size",
    f"{_REF}.fsdp_config.ulysses_sequence_parallel_size": f"{_REF}.ulysses_sequence_parallel_size",
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
}


def _one(tree: dict, path: str, value: Any, known: set[str], out: Translation) -> None:
    if path in _SP_COPIES:
        pop(tree, path)
        if value != 1 and get(tree, _SP_COPIES[path], None) != value:
            out.errors.append(f"{path}={show(value)}: set {_SP_COPIES[path]}={show(value)} instead (the role's degree)")
        return
    if path in GLOBAL_MICRO:
        return  # handled with the world size in _normalize_micro
    pattern = match(path, RENAMED)
    if pattern:
        pop(tree, path)
        if value is None:
            return  # verl's "unset": our default stands
        target = RENAMED[pattern]
        if target.startswith("../"):  # relative to the section holding `optim`
            target = path.rsplit(".", 2)[0] + "." + target[3:]
        elif "." not in target:  # same section, other name
            target = path.rsplit(".", 1)[0] + "." + target
        elif target.endswith(".*"):  # the same sub-path under the new prefix
            target = target[:-1] + path[len(pattern) - 1 :]
        if get(tree, target) is None:
            put(tree, target, value)
        return
    if path in _STANDALONE:
        pop(tree, path)
        out.standalone[path] = value
        return
    special = _SPECIAL.get(path)
    if special:
        pop(tree, path)
        special(tree, value, out)
        return
    pattern = match(path, NEEDS)
    if pattern:
        need = NEEDS[pattern]
        pop(tree, path)
        if need.ok and value not in need.ok and not _same_number(value, need.ok):
            fix = f"{path}={show(need.ok[0])}"
            out.errors.append(
                f"{path}={show(value)} needs {need.missing}, which hybridrl does not have; use {fix} or leave it out"
            )
        return
    pattern = match(path, IGNORED)
    if pattern:
        pop(tree, path)
        out.ignored.setdefault(IGNORED[pattern], []).append(path)


def _same_number(value: Any, ok: tuple) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and any(isinstance(o, (int, float)) and not isinstance(o, bool) and float(o) == float(value) for o in ok)
    )


def _ckpt_to_keep(tree: dict, value: Any, out: Translation) -> None:
    # hybridrl writes actor and critic into one step directory, so one count applies to both.
    current = get(tree, "trainer.max_ckpt_to_keep")
    if value is not None:
        put(tree, "trainer.max_ckpt_to_keep", value if current is None else max(current, value))


def _profiler_tool(tree: dict, value: Any, out: Translation) -> None:
    if value not in (None, "torch"):
        out.notices.append(
            f"global_profiler.tool={value}: hybridrl profiles with torch.profiler (Chrome trace and "
            "op table per process), not {value}; the steps in global_profiler.steps are profiled"
        )


def _nested(column: str, default: str):
    """verl's SFT `data.<column>_dict_keys=[a, b]`: the text is row[<column>][a][b]. hybridrl spells the same
    as a dotted path in the column key (`data.prompt_key=extra_info.question`, hybridrl/data/converters.py)."""

    def fold(tree: dict, value: Any, out: Translation) -> None:
        keys = [value] if isinstance(value, str) else value
        if keys in (None, []):
            return
        if not isinstance(keys, list) or not all(isinstance(k, str) and k and "." not in k for k in keys):
            out.errors.append(
                f"data.{column}_dict_keys={show(value)}: give a list of the dict keys to descend, e.g. ['question']"
            )
            return
        put(tree, f"data.{column}_key", ".".join([get(tree, f"data.{column}_key") or default, *keys]))

    return fold


_SPECIAL = {
    "trainer.max_actor_ckpt_to_keep": _ckpt_to_keep,
    "trainer.max_critic_ckpt_to_keep": _ckpt_to_keep,
    "global_profiler.tool": _profiler_tool,
    "sft.prompt_dict_keys": _nested("prompt", "prompt"),
    "sft.response_dict_keys": _nested("response", "response"),
}
# verl's standalone rollout (recipe/one_step_off_policy, recipe/fully_async_policy, hybrid_engine=False):
# trainer.n_gpus_per_node devices train, rollout.n_gpus_per_node more generate.
_STANDALONE = (
    f"{_ARR}.hybrid_engine",
    "rollout.n_gpus_per_node",
    "rollout.nnodes",
    f"{_R}.n_gpus_per_node",
    f"{_R}.nnodes",
)


def _standalone_rollout(tree: dict, defaults: dict[str, Any], out: Translation) -> None:
    """resource_pool.rollout from verl's keys: the rollout devices are added to trainer.n_gpus_per_node,
    whose devices become the actor's (resource_pool.actor_rollout_ref)."""
    keys = out.standalone
    gpus = next((keys[k] for k in ("rollout.n_gpus_per_node", f"{_R}.n_gpus_per_node") if keys.get(k)), None)
    nodes = next((keys[k] for k in ("rollout.nnodes", f"{_R}.nnodes") if keys.get(k)), None)
    hybrid = keys.get(f"{_ARR}.hybrid_engine", True)
    if not gpus:
        if hybrid is False:
            out.errors.append(
                f"{_ARR}.hybrid_engine=false needs rollout devices apart from the actor's: set rollout.n_gpus_per_node "
                "(verl's recipes) or resource_pool.rollout, or leave hybrid_engine out"
            )
        return
    trainer_nodes = get(tree, "trainer.nnodes", defaults.get("trainer.nnodes", 1)) or 1
    if nodes not in (None, trainer_nodes):
        out.errors.append(
            f"rollout.nnodes={nodes}: hybridrl's rollout pool spans the trainer's nodes (trainer.nnodes={trainer_nodes}); "
            f"use rollout.nnodes={trainer_nodes} with rollout.n_gpus_per_node devices on each"
        )
        return
    if get(tree, "resource_pool.rollout") is None:
        train = get(tree, "resource_pool.actor_rollout_ref") or get(
            tree, "trainer.n_gpus_per_node", defaults.get("trainer.n_gpus_per_node", 1)
        )
        put(tree, "resource_pool.rollout", gpus)
        put(tree, "resource_pool.actor_rollout_ref", train)
        put(tree, "trainer.n_gpus_per_node", (get(tree, "trainer.n_gpus_per_node") or train) + gpus)
        out.notices.append(
            f"verl's standalone rollout: {gpus} rollout device(s) per node apart from the actor's {train} "
            f"(resource_pool.rollout={gpus}, resource_pool.actor_rollout_ref={train}, "
            f"trainer.n_gpus_per_node={train + gpus} in all)"
            + (
                ""
                if get(tree, "trainer.mode") in ("one_step_off", "async")
                else "; with trainer.mode=sync the pool generates in turn with training: set trainer.mode=one_step_off "
                "(verl's one_step_off_policy recipe) or async (fully_async_policy) to overlap them"
            )
        )


# Values of keys we have that verl spells differently: verl's -1 for "all rows" is our null.
VALUE_FIXES = {"data.val_max_samples": (-1, None)}


def _world(tree: dict, defaults: dict[str, Any]) -> int:
    def val(key: str) -> Any:
        v = get(tree, key, defaults.get(key))
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None

    nodes, gpus = val("trainer.nnodes") or 1, val("resource_pool.actor_rollout_ref") or val("trainer.n_gpus_per_node") or 1
    return nodes * gpus


def _normalize_micro(tree: dict, defaults: dict[str, Any], out: Translation) -> None:
    """verl: `<x>_per_gpu = <x> // (world // sp)`; hybridrl trains without SP, so sp = 1 here."""
    world = _world(tree, defaults)
    for key, per_gpu in GLOBAL_MICRO.items():
        value = get(tree, key, "absent")
        if value == "absent":
            continue
        pop(tree, key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            out.errors.append(
                f"{key}={show(value)} must be an integer >= 1 (a global size, divided by the data-parallel size {world})"
            )
            continue
        if get(tree, per_gpu) is not None:
            out.errors.append(
                f"{key} and {per_gpu} are both set; set only one ({key} is verl's deprecated global "
                f"size, divided by the data-parallel size; {per_gpu} is per device)"
            )
            continue
        if value < world:
            out.errors.append(
                f"{key}={value} is smaller than the data-parallel size {world}, so each device would get "
                f"{value // world} sequences; use {key}={world} or more, or {per_gpu}"
            )
            continue
        put(tree, per_gpu, value // world)


# Choice values that other branches add (the key exists; these values are refused until then).
def verl_argv(tree: dict, out: Translation) -> None:
    """What only a verl command line (no hybridrl config file) gets: verl's engine and logger names."""
    name = get(tree, f"{_R}.name")
    if name in VERL_ENGINES:
        put(tree, f"{_R}.name", "auto")
        out.notices.append(
            f"{_R}.name={name}: hybridrl's own engine generates (native on a GPU, hf on CPU), with the same sampling settings"
        )
    loggers = get(tree, "trainer.logger")
    if isinstance(loggers, str):
        loggers = [loggers]
    if isinstance(loggers, list):
        dropped = [x for x in loggers if x in VERL_LOGGERS and VERL_LOGGERS[x] is None]
        kept = [VERL_LOGGERS.get(x) or x for x in loggers if x not in dropped]
        if dropped:
            out.notices.append(
                f"trainer.logger: {', '.join(dropped)} not available here; metrics also go to metrics.jsonl in the run directory"
            )
        put(tree, "trainer.logger", list(dict.fromkeys([*kept, "jsonl"])))


# The DAPO recipe's config (recipe/dapo/config/dapo_trainer.yaml) on top of verl's PPO defaults.
DAPO_DEFAULTS: dict[str, Any] = {"trainer.project_name": "verl-dapo", "reward_model.reward_manager": "dapo"}


def verl_base(entry: str) -> dict:
    """A tree holding verl's defaults where they differ from ours, for a verl command line of
    `entry` (ppo: verl.trainer.main_ppo, dapo: recipe.dapo.main_dapo; sft: the SFT trainer,
    whose defaults hybridrl.sft_trainer passes itself)."""
    tree: dict = {}
    if entry == "sft":
        return tree
    defaults = {**VERL_DEFAULTS}
    if entry == "dapo":
        defaults.update(DAPO_DEFAULTS)
    for key, value in defaults.items():
        put(tree, key, list(value) if isinstance(value, list) else value)
    return tree


# --------------------------------------------------------------------------- docs/verl.md


def markdown() -> str:
    """The tables of docs/verl.md between its generated-section markers (tests/verl checks them)."""

    def target(pattern: str, to: str) -> str:
        if to.startswith("../"):
            return f"{pattern.split('.optim.')[0]}.{to[3:]}"
        return to if "." in to else f"{pattern.rsplit('.', 1)[0]}.{to}"

    out = ["### Renamed (same meaning, hybridrl's key)", "", "| verl key | hybridrl key |", "| --- | --- |"]
    out += [f"| `{k}` | `{target(k, v)}` |" for k, v in RENAMED.items()]
    out += [
        "| `trainer.max_actor_ckpt_to_keep`, `trainer.max_critic_ckpt_to_keep` | `trainer.max_ckpt_to_keep` "
        "(one step directory holds both: the larger count) |",
        "| `data.val_max_samples=-1` | `data.val_max_samples=null` (every row) |",
        "| `data.prompt_dict_keys=[a, b]`, `data.response_dict_keys=[a, b]` (SFT) | `data.prompt_key=<prompt_key>.a.b`, "
        "`data.response_key=<response_key>.a.b` (a dotted path into a dict column) |",
        "",
    ]
    out += [
        "### Deprecated global micro-batch sizes (divided by the data-parallel size, as verl does)",
        "",
        "| verl key | becomes |",
        "| --- | --- |",
    ]
    out += [f"| `{k}` | `{v}` = value // (nnodes x n_gpus_per_node) |" for k, v in GLOBAL_MICRO.items()]
    out += ["", "### Ignored, no effect here (listed once in one notice at start)", "", "| verl key | why |", "| --- | --- |"]
    out += [f"| `{k}` | {v} |" for k, v in IGNORED.items()]
    out += [
        "",
        "### Refused unless at the harmless value (an error naming what is missing)",
        "",
        "| verl key | accepted values | what hybridrl lacks |",
        "| --- | --- | --- |",
    ]
    for k, n in NEEDS.items():
        ok = ", ".join(f"`{show(v)}`" for v in n.ok) or "any (checked through its switch)"
        out.append(f"| `{k}` | {ok} | {n.missing} |")
    out += ["", "### verl's defaults used with no hybridrl config file", "", "| key | verl default |", "| --- | --- |"]
    out += [f"| `{k}` | `{show(v)}` |" for k, v in VERL_DEFAULTS.items()]
    return "\n".join(out) + "\n"
