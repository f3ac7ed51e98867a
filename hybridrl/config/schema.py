"""The config tree: one dataclass per component, each field documented once.

Key names follow verl's so that existing launch scripts carry over. The `doc` of every
field lives in its metadata (see `option`), which is what `docs.py` renders into
docs/config.md and what `hybridrl explain` points users to.

A few fields default to None meaning "inherit from another key" (clip_ratio_low/high,
the critic's model path and batch sizes, tokenizer paths, the output directory).
`resolve(cfg)` fills them in; `load_config` and `config_from_dict` call it, so the config a
run saves to disk shows the concrete values it trained with.
"""

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, NamedTuple

from .names import (
    ALGORITHM_NAMES,
    DEVICES,
    DPO_LOSS_TYPES,
    KL_CTRL_TYPES,
    KL_ESTIMATORS,
    LOGGERS,
    LOSS_AGG_MODES,
    LR_SCHEDULERS,
    PACKED_ATTN_BACKENDS,
    RESUME_MODES,
    ROLLOUT_NAMES,
    ROUTER_REPLAY_MODES,
    TOOL_CALL_FORMATS,
    TRAINER_MODES,
    TRUNCATE_SIDES,
    TRUNCATIONS,
    WEIGHT_STAGINGS,
)
from .rules import (
    AT_LEAST_0,
    AT_LEAST_1,
    BELOW_1,
    BETAS,
    OFF_OR_0,
    OFF_OR_1,
    POSITIVE,
    PROB,
    ROLLOUT_DEVICES,
    THREADS,
    UNIT,
    Rule,
)


def option(default: Any, doc: str, *, check: Rule | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with its one-place documentation and checks.

    `default` may be a plain value, a list/dict (copied per instance) or a zero-argument
    callable such as a component class (called per instance). `check` is the range rule its
    value must pass (config/rules.py), `choices` the names it may take (config/names.py; for a
    list, every entry); `validate` reads both from here, so a key's rules are written once.
    """
    meta = {"doc": doc, "check": check, "choices": choices}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    """Where prompts come from and how long prompts and responses may be."""

    train_files: str | list[str] = option("", "Training prompts: one or more local parquet or jsonl files.")
    val_files: str | list[str] | None = option(
        None,
        "Validation rows in the training rows' format (prompts for RL; pairs / labelled examples / SFT rows for "
        "dpo / kto / sft, scored by log-probs: docs/preference.md); null = no validation.",
    )
    prompt_key: str = option("prompt", "Column holding the prompt (a string or a list of chat messages).")
    response_key: str | None = option(None, "SFT: column holding the response to train on; null = `response` (or `completion`).")
    reward_fn_key: str = option("data_source", "Column that selects the reward function for each row.")
    max_prompt_length: int = option(512, "Longest prompt in tokens; longer ones are handled per `truncation`.", check=AT_LEAST_1)
    max_response_length: int = option(512, "Most tokens generated per response.", check=AT_LEAST_1)
    train_batch_size: int = option(256, "Prompts per training step (before `rollout.n` samples each).", check=AT_LEAST_1)
    val_batch_size: int | None = option(
        None, "Prompts per validation batch; null = the whole validation set at once.", check=AT_LEAST_1
    )
    val_max_samples: int | None = option(None, "Use only the first N validation rows; null = all of them.", check=AT_LEAST_1)
    truncation: str = option(
        "error",
        "A prompt over max_prompt_length: raise, or cut tokens from the left, the right or the middle "
        "(keeping the first and last max_prompt_length / 2 tokens).",
        choices=TRUNCATIONS,
    )
    filter_overlong_prompts: bool = option(
        False,
        "Drop prompts longer than max_prompt_length when the data is loaded (the count is printed) instead of "
        "applying `truncation`.",
    )
    gen_batch_size: int | None = option(
        None, "Prompts generated per round with algorithm.filter_groups (DAPO dynamic sampling); null = train_batch_size."
    )
    shuffle: bool = option(True, "Shuffle the training prompts every epoch.")
    seed: int | None = option(None, "Seed of the training-prompt shuffle; null = trainer.seed.")


# --------------------------------------------------------------------------- actor / rollout / ref


@dataclass
class ModelConfig:
    """The policy model; the reference model is a frozen copy of it."""

    path: str = option("", "Local Hugging Face model directory (config.json, weights, tokenizer).")
    tokenizer_path: str | None = option(None, "Tokenizer directory; null = `path`.")
    random_init: bool = option(
        False, "Build the model from config.json with random weights (tests, quickstart, throughput benchmarks)."
    )
    trust_remote_code: bool = option(False, "Allow model code shipped inside the model directory to run.")
    enable_gradient_checkpointing: bool = option(False, "Recompute activations in the backward pass to save memory.")
    override_config: dict = option({}, "Entries merged into the Hugging Face model config before building the model.")
    use_remove_padding: bool = option(
        True, "Padding-free forward passes: each micro-batch's sequences packed into one row (docs/performance.md)."
    )
    packed_attn_backend: str = option(
        "auto",
        "Attention kernel of packed passes: auto (fastest measured: varlen on GPU, sdpa on CPU), varlen, flex, sdpa.",
        choices=PACKED_ATTN_BACKENDS,
    )
    share_prompts: bool = option(
        True,
        "Packed passes (update, old and reference log-probs) compute a prompt that several sequences of a micro-batch "
        "repeat (GRPO's n samples, DPO's pairs) once: its tokens enter the row once and attention still reads them for "
        "every sequence. The same math as unshared (float rounding aside); token budgets count the prompt once "
        "(docs/performance.md). Off under sequence parallelism.",
    )
    lora_rank: int = option(
        0, "LoRA rank (peft); 0 = full fine-tuning. The reference policy is the base, adapters off.", check=AT_LEAST_0
    )
    lora_alpha: int = option(16, "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank.", check=POSITIVE)
    lora_adapter_path: str | None = option(
        None,
        "A saved peft adapter directory (adapter_config.json + weights) to start LoRA training from; its "
        "rank, alpha and target modules replace lora_rank, lora_alpha and target_modules.",
    )
    target_modules: str | list[str] = option(
        "all-linear", "Modules that get LoRA adapters: all-linear (every linear layer but the LM head) or a list of names."
    )


@dataclass
class OptimConfig:
    """AdamW with a warm-up then a constant or cosine learning rate."""

    lr: float = option(1e-6, "Peak learning rate.", check=POSITIVE)
    weight_decay: float = option(0.01, "AdamW weight decay.", check=AT_LEAST_0)
    betas: list[float] = option([0.9, 0.999], "AdamW (beta1, beta2).", check=BETAS)
    lr_warmup_steps_ratio: float = option(0.0, "Warm-up length as a fraction of the total optimizer steps.", check=UNIT)
    lr_warmup_steps: int = option(
        -1, "Warm-up length in optimizer steps; a value >= 0 overrides lr_warmup_steps_ratio.", check=OFF_OR_0
    )
    lr_scheduler_type: str = option("constant", "Learning-rate shape after warm-up.", choices=LR_SCHEDULERS)
    min_lr_ratio: float = option(0.0, "Cosine schedule floor as a fraction of `lr`.", check=UNIT)


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)


@dataclass
class FSDPConfig:
    """FSDP2 sharding of a model over several devices (no effect on one device or on CPU)."""

    param_offload: bool = option(
        False,
        "Keep the sharded weights and gradients in CPU memory (FSDP2 CPUOffloadPolicy); each block is copied "
        "to the GPU for its forward/backward, and the optimizer step runs on the CPU. Saves the most GPU memory.",
    )
    optimizer_offload: bool = option(
        False,
        "Keep the optimizer state (Adam moments) in CPU memory between optimizer steps; it is copied to the "
        "GPU for each step only. Implied by param_offload.",
    )
    fsdp_size: int = option(
        -1,
        "Ranks in one FSDP shard group (verl's meaning): -1 = shard over all of the role's ranks; a divisor of "
        "them = shard within groups of that size and replicate across the groups (HSDP: less communication between "
        "nodes, more memory per device); 1 = no FSDP at all: every rank holds the whole model and the gradients "
        "are all-reduced once per optimizer step (for models whose training state, ~16 bytes a parameter, fits "
        "one device; not with param_offload). The reference and a colocated critic use the actor's value.",
    )
    reshard_after_forward: bool = option(
        True,
        "In an update, free each block's gathered weights after its forward (true) or keep them until its backward "
        "(false: the backward does not gather them again; the model's bf16 weights stay on the device during each "
        "micro-batch). Same results. Log-prob passes always free them.",
    )
    reduce_grads_once: bool = option(
        False,
        "Reduce-scatter the gradients once per optimizer step, after the last micro-batch, instead of after each "
        "(no communication while they accumulate; each rank holds the full fp32 gradient, 4 bytes a parameter, "
        "during the step). The same gradient up to the order of float additions.",
    )
    expert_parallel_size: int = option(
        1,
        "Mixtures of experts (Qwen3-MoE, Qwen2-MoE): each group of this many consecutive data-parallel ranks "
        "splits every sparse layer's experts between its ranks (E / this whole experts each) and sends each "
        "token to the rank of its experts (all-to-all), instead of FSDP-sharding them; the dense parts stay "
        "FSDP2-sharded. The same loss and gradients as 1 (docs/models.md). verl's VeOmni engine key; its "
        "Megatron actor.megatron.expert_model_parallel_size is read as this. Actor only (the reference "
        "uses the actor's); needs fsdp_size=-1, no sequence parallelism, no LoRA, no param_offload.",
        check=AT_LEAST_1,
    )


@dataclass
class PolicyLossConfig:
    """Which policy objective the actor minimises, and the parameters of some of them (docs/algorithms.md)."""

    loss_mode: str = option(
        "vanilla",
        "Policy loss by its registered name (docs/algorithms.md); vanilla = PPO's clipped surrogate. Your "
        "own: hybridrl.algorithms.register_policy_loss in a file listed in `extensions`.",
    )
    clip_cov_ratio: float = option(0.0002, "clip_cov: at most this share of the tokens is detached.")
    clip_cov_lb: float = option(1.0, "clip_cov: lower bound of the covariance of a token that may be detached.")
    clip_cov_ub: float = option(5.0, "clip_cov: upper bound of the covariance of a token that may be detached.")
    kl_cov_ratio: float = option(0.0002, "kl_cov: share of the tokens (largest covariance) that get the KL penalty.")
    ppo_kl_coef: float = option(0.1, "kl_cov: weight of the |logp - logp_old| penalty on those tokens.")


@dataclass
class RouterReplayConfig:
    """Mixtures of experts: which routing the actor's forward passes use (verl's router_replay; docs/models.md)."""

    mode: str = option(
        "disabled",
        "disabled: every pass routes with the router's own top-k. R3: the rollout engine records the experts of "
        "every token (native engine) and the old-log-prob and update passes replay them, so the trainer's "
        "probabilities follow the routing the samples were drawn with (training/rollout_probs_diff_* shrink). "
        "R2: the old-log-prob pass records its routing and the update passes replay it (the update sees pi_old's "
        "routing while the weights move). The router's weights still learn: only the choice of the k experts is "
        "replayed. The reference policy always routes itself.",
        choices=ROUTER_REPLAY_MODES,
    )


@dataclass
class ActorConfig:
    """The policy update: PPO-style clipped loss, optional KL loss and entropy bonus."""

    ppo_mini_batch_size: int = option(
        64, "Prompts per optimizer step; each brings `rollout.n` sequences. Must divide data.train_batch_size.", check=AT_LEAST_1
    )
    ppo_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward/backward pass on one device; null = the whole per-device mini-batch.", check=AT_LEAST_1
    )
    ppo_epochs: int = option(1, "Passes over each step's rollouts.", check=AT_LEAST_1)
    reuse_on_policy_log_prob: bool = option(
        False,
        "Skip the old log-prob stage (ppo_epochs=1, shuffle=false): the first mini-batch's pi_old is the update's "
        "own forward, detached, which it equals (ratio 1); the later mini-batches' pi_old is computed by the update "
        "before its first optimizer step. The same loss and gradients up to float rounding, (k-1)/k of the pass for "
        "k mini-batches (none for one). Not used with algorithm.use_kl_in_reward, a rollout correction or "
        "trainer.mode other than sync (they read pi_old before the update); then the pass runs. verl calls reusing "
        "log-probs 'bypass'.",
    )
    shuffle: bool = option(False, "Shuffle the rollouts before splitting them into mini-batches.")
    clip_ratio: float = option(0.2, "PPO clip range epsilon for the importance ratio.", check=POSITIVE)
    clip_ratio_low: float | None = option(None, "Lower clip range (1 - low); null = clip_ratio.", check=POSITIVE)
    clip_ratio_high: float | None = option(
        None, "Upper clip range (1 + high); null = clip_ratio. DAPO raises it.", check=POSITIVE
    )
    clip_ratio_c: float = option(
        3.0,
        "Dual-clip bound for negative advantages; must be > 1.",
        check=Rule(lambda v: v > 1, "must be > 1 (the dual-clip bound on the ratio for negative advantages)"),
    )
    loss_agg_mode: str = option("token-mean", "How per-token losses are averaged into one number.", choices=LOSS_AGG_MODES)
    policy_loss: PolicyLossConfig = option(PolicyLossConfig, "The policy objective (loss_mode) and its parameters.")
    entropy_coeff: float = option(0.0, "Weight of the entropy bonus (0 = off).")
    use_kl_loss: bool = option(False, "Add a KL(policy || reference) term to the actor loss (GRPO-style).")
    kl_loss_coef: float = option(0.001, "Weight of the KL loss term.", check=AT_LEAST_0)
    kl_loss_type: str = option("low_var_kl", "KL estimator for the KL loss.", choices=KL_ESTIMATORS)
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value.", check=POSITIVE)
    use_dynamic_bsz: bool = option(
        False, "Micro-batches by token budget (ppo_max_token_len_per_gpu) instead of ppo_micro_batch_size_per_gpu."
    )
    ppo_max_token_len_per_gpu: int = option(
        16384,
        "With use_dynamic_bsz: most real tokens (prompt + response) in one forward/backward pass on one device.",
        check=AT_LEAST_1,
    )
    use_torch_compile: bool = option(
        True, "torch.compile the policy's decoder layers on CUDA (faster, BENCHMARKS.md); CPU runs stay eager."
    )
    use_cuda_graph: bool = option(
        False,
        "Replay the packed passes of the policy and the reference (update, old log-prob, reference log-prob) as "
        "CUDA graphs, one launch per micro-batch instead of thousands: for short micro-batches and slow host CPUs "
        "(docs/performance.md). One GPU, use_remove_padding with varlen attention, no LoRA; keeps the graphs' "
        "activations and fp32 gradient buffers allocated between updates.",
    )
    optim: OptimConfig = option(OptimConfig, "Actor optimizer.")
    fsdp_config: FSDPConfig = option(FSDPConfig, "Sharding of the policy over several devices.")
    router_replay: RouterReplayConfig = option(RouterReplayConfig, "Mixtures of experts: router replay (R2/R3).")
    ulysses_sequence_parallel_size: int = option(
        1,
        "Ulysses sequence parallelism: each sequence batch is split over this many devices (heads split around "
        "attention); the data-parallel size becomes devices / this. Needs model.use_remove_padding=true.",
        check=AT_LEAST_1,
    )


@dataclass
class ValKwargsConfig:
    """Sampling used for validation."""

    n: int = option(1, "Samples per validation prompt.", check=AT_LEAST_1)
    do_sample: bool = option(False, "Sample (true) or decode greedily (false).")
    temperature: float = option(0.0, "Sampling temperature.", check=AT_LEAST_0)
    top_p: float = option(1.0, "Nucleus sampling mass.", check=PROB)
    top_k: int = option(-1, "Keep only the k most likely tokens; -1 = off.", check=OFF_OR_1)


@dataclass
class MultiTurnConfig:
    """Multi-turn agent rollouts: the model calls tools and talks with a simulated user mid-response (docs/agents.md)."""

    enable: bool = option(
        False,
        "Roll out multi-turn trajectories: each model turn may call tools (run concurrently while other sequences "
        "decode) or get a user reply from an interaction; tool and user tokens are appended to the same sequence "
        "in the KV cache and masked out of the loss. Needs rollout.name=native.",
    )
    format: str = option(
        "hermes",
        "How tool calls are written: hermes (<tool_call>{json}</tool_call>, Qwen2.5/Hermes templates; the tools' "
        "schemas go into the prompt via the chat template) or code (every ```python block of a turn runs with "
        "the python tool; its output comes back as a user message).",
        choices=TOOL_CALL_FORMATS,
    )
    max_assistant_turns: int | None = option(None, "Model turns per trajectory; null = until the token budget ends it.")
    max_user_turns: int | None = option(None, "Interaction (user) turns per trajectory; null = no limit.")
    max_turn_tokens: int | None = option(
        None, "Tokens one model turn may sample; a turn cut here ends the trajectory (truncated). null = the rest of the budget."
    )
    max_parallel_calls: int = option(1, "Tool calls of one turn that run (the rest are answered with an error).")
    max_tool_response_length: int = option(256, "Tokens of one tool result the model sees; longer results are cut.")
    tool_response_truncate_side: str = option(
        "middle", "Which part of a long tool result is cut: left, middle or right.", choices=TRUNCATE_SIDES
    )
    tool_timeout_s: float = option(30.0, "Seconds one tool call may take; a slower call is answered with an error.")
    tool_config_path: str | None = option(
        None, "Tool config YAML (verl's shape: tools: [{class_name, config, tool_schema}]); docs/agents.md."
    )
    interaction_config_path: str | None = option(
        None, "Interaction config YAML (verl's shape: interaction: [{name, class_name, config}]); docs/agents.md."
    )


@dataclass
class ForcedLengthsConfig:
    """Benchmarks: every response generated to a length drawn from a heavy-tailed distribution, EOS
    ignored (rollout/lengths.py; docs/async.md, the long-tail workload)."""

    distribution: str | None = option(
        None,
        "Off (null), lognormal (median, sigma; the default schedule is a reasoning model's: p50 350, p99 ~3,584 "
        "tokens) or histogram (a JSON file of a real run's lengths). Each sample's length is a function of "
        "(seed, its prompt's uid, its index): the same workload in every trainer.mode and on any GPU count. "
        "Native and hf engines, single-turn.",
    )
    median: float = option(350.0, "lognormal: the median response length in tokens.")
    sigma: float = option(1.0, "lognormal: standard deviation of log(length): the tail's width.")
    min: int = option(1, "Shortest response in tokens.")
    max: int | None = option(None, "Longest response (longer draws are cut here); null = data.max_response_length.")
    seed: int = option(0, "Seed of the draws.")
    histogram: str | None = option(
        None, 'distribution=histogram: a JSON file {"edges": [e0, ..., ek], "counts": [c1, ..., ck]} of lengths.'
    )


@dataclass
class RolloutConfig:
    """Generation of responses during training."""

    name: str = option(
        "auto",
        "Generation engine: native (paged KV cache, continuous batching, CUDA graphs; Llama/Qwen2/Qwen3 "
        "family, others fall back to hf), hf (transformers generate), vllm (only where vLLM is installed); "
        "auto = native on a GPU, hf on CPU.",
        choices=ROLLOUT_NAMES,
    )
    n: int = option(1, "Responses sampled per prompt (the group size for GRPO/RLOO).", check=AT_LEAST_1)
    temperature: float = option(1.0, "Sampling temperature.", check=AT_LEAST_0)
    top_p: float = option(1.0, "Nucleus sampling mass.", check=PROB)
    top_k: int = option(-1, "Keep only the k most likely tokens; -1 = off.", check=OFF_OR_1)
    do_sample: bool = option(True, "Sample (true) or decode greedily (false).")
    max_num_seqs: int = option(
        1024,
        "Sequences one device generates together (native: admitted as the KV cache allows; the samples are the same at "
        "any value). verl's is 256; a step's samples in one wave are faster (BENCHMARKS.md: GSM8K, 512 samples).",
        check=AT_LEAST_1,
    )
    gpu_memory_utilization: float = option(
        0.5,
        "native: fraction of the GPU memory free at wake-up (after the trainer and the engine's weights) "
        "that the KV cache and decode workspace may take.",
        check=PROB,
    )
    enforce_eager: bool = option(False, "native: decode without CUDA graphs (slower; for debugging).")
    free_cache_engine: bool = option(True, "native: free the KV cache after each generation so training gets the memory.")
    update_weights_bucket_megabytes: float = option(
        512.0,
        "resource_pool.rollout: the policy's weights go to the rollout pool in broadcasts of this many MB "
        "(verl's checkpoint_engine.update_weights_bucket_megabytes), staged as update_weights_staging says.",
        check=POSITIVE,
    )
    update_weights_staging: str = option(
        "auto",
        "resource_pool.rollout: where the trainer's rank 0 keeps a weight push until the rollout pool has it: device "
        "(buckets on its GPU: no host round trip, holds the policy's size in bf16 there until the pool receives), "
        "host (a pinned host arena reused across pushes: frees the GPU while the pool is busy), auto = device when "
        "the push fits in half the GPU's free memory at send time, else host (docs/async.md). Metric "
        "rollout_pool/device_staging.",
        choices=WEIGHT_STAGINGS,
    )
    weight_checksum_interval: int = option(
        20,
        "resource_pool.rollout: every this many weight pushes, each rollout rank checksums the weights its engine "
        "loaded against the trainer's (as sent, on the device) and stops the run naming the tensors that differ; "
        "0 = never. Metrics rollout_pool/checksums_verified, rollout_pool/checksum_ms (docs/distributed.md).",
        check=Rule(lambda v: isinstance(v, int) and v >= 0, "must be an integer >= 0"),
    )
    max_num_batched_tokens: int = option(8192, "native: prompt tokens (padded) prefilled in one forward pass.", check=AT_LEAST_1)
    decode_steps_per_sync: int | None = option(
        None,
        "native: decode steps launched together (one CUDA-graph replay) before the host reads their tokens; a "
        "sequence that ends mid-launch runs the rest as wasted steps (dropped). The same tokens at any value. "
        "null = 1 (on an H200 host, 8 was no faster: the host already keeps up one step ahead; BENCHMARKS.md).",
        check=Rule(lambda v: isinstance(v, int) and 1 <= v <= 64, "must be in [1, 64]"),
    )
    enable_prefix_caching: bool = option(
        False,
        "native (TP=1): a prompt whose first full KV blocks (16 tokens each) equal those of a prompt already in the "
        "cache -- a shared system prompt -- shares them and prefills only the rest, within one generation (the "
        "weights change between them). The same tokens; log-probs equal to float precision. Metric "
        "rollout/prefix_cache_hit_rate (share of prompt tokens not recomputed).",
    )
    enable_chunked_prefill: bool = option(
        False,
        "native (TP=1): prefill a prompt longer than max_num_batched_tokens in chunks of that many tokens, one chunk "
        "between decode steps, so running sequences keep decoding (without it a long prompt is prefilled in one "
        "pass while they wait). The same tokens; log-probs equal to float precision. Metric rollout/prefill_chunks.",
    )
    tensor_model_parallel_size: int = option(
        1,
        "native: ranks per rollout replica. The actor's ranks generate as world / tp replicas of tp consecutive "
        "ranks, each holding a tensor-parallel shard of the model and of the KV cache (column/row/vocabulary-"
        "parallel; the same tokens and log-probs as tp=1). Must divide the actor's ranks and fit the model's "
        "heads; needs rollout.name=native (or auto on a GPU).",
        check=AT_LEAST_1,
    )
    log_prob_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward pass when recomputing old log-probs; null = all of a device's sequences.", check=AT_LEAST_1
    )
    log_prob_use_dynamic_bsz: bool | None = option(None, "Old log-prob passes by token budget; null = actor.use_dynamic_bsz.")
    log_prob_max_token_len_per_gpu: int | None = option(
        None, "Token budget of one old log-prob pass; null = actor.ppo_max_token_len_per_gpu.", check=AT_LEAST_1
    )
    val_kwargs: ValKwargsConfig = option(ValKwargsConfig, "Sampling for validation.")
    multi_turn: MultiTurnConfig = option(MultiTurnConfig, "Multi-turn agent rollouts with tools and interactions.")
    forced_response_lengths: ForcedLengthsConfig = option(
        ForcedLengthsConfig, "Benchmarks: responses of drawn lengths, EOS ignored (the long-tail workload)."
    )


@dataclass
class RefConfig:
    """The frozen reference policy (used only when a KL term is on)."""

    log_prob_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward pass for reference log-probs; null = all of a device's sequences.", check=AT_LEAST_1
    )
    fsdp_config: FSDPConfig = option(FSDPConfig, "Sharding of the reference (only param_offload applies: no optimizer).")
    log_prob_use_dynamic_bsz: bool | None = option(
        None, "Reference log-prob passes by token budget; null = actor.use_dynamic_bsz."
    )
    log_prob_max_token_len_per_gpu: int | None = option(
        None, "Token budget of one reference log-prob pass; null = actor.ppo_max_token_len_per_gpu.", check=AT_LEAST_1
    )
    ulysses_sequence_parallel_size: int | None = option(
        None,
        "Sequence parallelism of the reference passes; null = the actor's (it runs in the actor's processes).",
        check=AT_LEAST_1,
    )


@dataclass
class ActorRolloutRefConfig:
    """The policy in its three roles: trained actor, rollout generator, frozen reference."""

    model: ModelConfig = option(ModelConfig, "The policy model.")
    actor: ActorConfig = option(ActorConfig, "Policy update.")
    rollout: RolloutConfig = option(RolloutConfig, "Generation.")
    ref: RefConfig = option(RefConfig, "Reference policy.")


# --------------------------------------------------------------------------- critic


@dataclass
class CriticModelConfig:
    """The value model (a language model with a scalar head)."""

    path: str | None = option(None, "Local Hugging Face model directory; null = the actor's model path.")
    tokenizer_path: str | None = option(None, "Tokenizer directory; null = the actor's tokenizer.")
    enable_gradient_checkpointing: bool = option(False, "Recompute activations in the backward pass to save memory.")
    fsdp_config: FSDPConfig = option(FSDPConfig, "Sharding of the value model over several devices.")
    use_remove_padding: bool = option(True, "Padding-free value and update passes (see actor_rollout_ref.model).")
    share_prompts: bool = option(True, "Packed value passes compute a repeated prompt once (see actor_rollout_ref.model).")


@dataclass
class CriticConfig:
    """The value function; trained only when algorithm.adv_estimator=gae."""

    model: CriticModelConfig = option(CriticModelConfig, "The value model.")
    optim: OptimConfig = option(_critic_optim, "Critic optimizer.")
    ppo_mini_batch_size: int | None = option(None, "Prompts per critic optimizer step; null = the actor's.", check=AT_LEAST_1)
    ppo_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward/backward pass on one device; null = the whole per-device mini-batch.", check=AT_LEAST_1
    )
    ppo_epochs: int | None = option(None, "Passes over each step's rollouts; null = the actor's.", check=AT_LEAST_1)
    use_dynamic_bsz: bool | None = option(
        None, "Micro-batches by token budget instead of ppo_micro_batch_size_per_gpu; null = the actor's use_dynamic_bsz."
    )
    ppo_max_token_len_per_gpu: int = option(
        32768,
        "With use_dynamic_bsz: most real tokens in one forward/backward pass of the critic on one device.",
        check=AT_LEAST_1,
    )
    forward_max_token_len_per_gpu: int | None = option(
        None,
        "With use_dynamic_bsz: token budget of one value (forward-only) pass; null = ppo_max_token_len_per_gpu.",
        check=AT_LEAST_1,
    )
    cliprange_value: float = option(0.5, "Clip range of the value update around the old values.", check=POSITIVE)
    loss_agg_mode: str | None = option(
        None, "How per-token value losses are averaged; null = the actor's loss_agg_mode.", choices=LOSS_AGG_MODES
    )
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value.", check=POSITIVE)
    ulysses_sequence_parallel_size: int | None = option(
        None,
        "Sequence parallelism of the critic; null = the actor's. May differ only on its own resource pool.",
        check=AT_LEAST_1,
    )


# --------------------------------------------------------------------------- reward, algorithm


@dataclass
class RemoteRewardConfig:
    """A reward computed by an HTTP service: one POST per response (hybridrl/rewards/remote.py, docs/api.md)."""

    url: str | None = option(
        None,
        "Endpoint that scores one response: POST {data_source, solution_str, ground_truth, extra_info} as JSON, "
        "answer a number or {score: ..., other numbers}; null = no remote scoring.",
    )
    timeout_s: float = option(10.0, "Seconds one HTTP attempt may take (connect + answer).")
    max_concurrency: int = option(8, "Requests in flight at once.")
    retries: int = option(2, "More attempts after a timeout, a refused connection, HTTP 429 or 5xx.")
    backoff_s: float = option(0.5, "Wait before retry k: backoff_s * 2**(k-1) seconds.")
    circuit_breaker_failures: int = option(
        5, "After this many failed responses in a row, stop calling for circuit_breaker_cooldown_s; 0 = never stop."
    )
    circuit_breaker_cooldown_s: float = option(30.0, "Seconds without calls once the circuit breaker opens.")
    headers: dict = option({}, "Extra HTTP headers, e.g. {Authorization: Bearer ...}.")
    in_process: bool = option(
        False,
        "Make the requests from threads of the trainer process instead of a helper process. The helper keeps their "
        "Python (JSON, HTTP) from competing with the trainer's, e.g. with the decode loop when responses are scored "
        "as they end (docs/performance.md).",
    )


@dataclass
class CustomRewardConfig:
    """A reward function of your own, loaded from a Python file (or served over HTTP: `remote`)."""

    path: str | None = option(None, "Python file defining the reward function; null = the built-in scorers.")
    name: str = option("compute_score", "Name of the function in that file.")
    reward_kwargs: dict = option(
        {},
        "Keyword arguments for the reward function, built-in or custom; e.g. {format_score: 0.1} gives a "
        "well-formed but wrong GSM8K answer 0.1.",
    )
    timeout_s: float = option(
        10.0,
        "Seconds one call of the reward function may take (a batched function's: its one call per batch). A "
        "function runs in separate processes: one that hangs past this, exits, crashes or raises scores 0 for its "
        "samples and counts in reward/timeouts or reward/errors; the run goes on (hybridrl/rewards/pool.py).",
    )
    num_workers: int = option(
        2,
        "Processes that run a reward function (custom_reward_function.path, or one given to the Python API); the "
        "built-in scorers run in a thread of the trainer process.",
    )
    memory_limit_mb: int | None = option(
        8192,
        "Address space (RLIMIT_AS) of each process running a reward function, in MB (a fork of the trainer, for a "
        "function given to the Python API: on top of what it inherited); an allocation past it raises MemoryError "
        "in that call, which scores 0 and counts in reward/errors. null = no limit.",
    )
    remote: RemoteRewardConfig = option(RemoteRewardConfig, "Score with an HTTP service in place of a function.")


@dataclass
class OverlongBufferConfig:
    """DAPO's soft penalty on responses that run into the last `len` tokens of max_response_length."""

    enable: bool = option(False, "Penalise overlong responses.")
    len: int = option(0, "Length of the buffer at the end of data.max_response_length, in tokens.")
    penalty_factor: float = option(
        1.0, "Penalty of a response that reaches max_response_length; it grows linearly from 0 at the buffer's start."
    )
    log: bool = option(False, "Also log the penalty as reward/overlong_reward/mean and reward/overlong/mean.")


@dataclass
class RewardModelModelConfig:
    """The reward model's checkpoint (docs/reward_models.md)."""

    path: str | None = option(
        None,
        "Local Hugging Face directory of a sequence classifier with one label (AutoModelForSequenceClassification, "
        "num_labels=1; `hybridrl export` of an algorithm.name=rm run writes one).",
    )
    input_tokenizer: str | None = option(
        None,
        "verl's switch for re-rendering: set (to any tokenizer path, verl's default is the policy's), each prompt + "
        "response is rendered as chat messages with the reward model's own chat template and tokenizer; null = "
        "re-render only when the reward model's tokenizer or chat template differs from the policy's, else score "
        "the policy's token ids as they are.",
    )
    external_lib: str | None = option(None, "A Python module imported before loading the model (custom architectures).")
    trust_remote_code: bool = option(False, "Allow model code shipped inside the checkpoint directory.")
    use_remove_padding: bool = option(True, "Padding-free scoring passes (see actor_rollout_ref.model.use_remove_padding).")


@dataclass
class GenerativeRewardModelConfig:
    """An LLM judge as the reward model (docs/reward_models.md): reward_model.model.path is a causal LM."""

    enable: bool = option(False, "Score with a judge's generated verdict instead of a sequence classifier's head.")
    prompt_template: str = option(
        "Grade the response to the question. The reference answer is {ground_truth}.\nQuestion: {prompt}\n"
        "Response: {response}\nReply with one number from 0 (wrong) to 10 (fully correct).",
        "The judge's user message; {prompt}, {response} and {ground_truth} are filled in, then the judge's chat "
        "template is applied.",
    )
    parse_fn: str = option(
        "hybridrl.rewards.judge:last_number",
        "module:function turning the judge's answer into a score (a float, or None = unparsable: scored 0 and "
        "counted in reward_model/judge_parse_errors).",
    )
    max_new_tokens: int = option(32, "Longest verdict, in tokens (greedy decoding).")
    max_prompt_length: int = option(1024, "Judge prompts are cut to this many tokens from the left.")
    gpu_memory_utilization: float = option(0.2, "Native engine: share of the GPU the judge's KV cache may take.")


@dataclass
class SandboxFusionConfig:
    """Code answers scored by running them on a SandboxFusion service (verl's reward_model.sandbox_fusion):
    samples of a code data source (codecontests, apps, codeforces, taco, ...) run against their test
    cases; others keep their built-in scorer. Requests follow custom_reward_function.remote's timeout,
    retries and circuit breaker (hybridrl/rewards/code_sandbox.py)."""

    url: str | None = option(None, "The service's /run_code endpoint, e.g. http://host:8080/run_code; null = off.")
    max_concurrent: int = option(64, "Responses scored at once (one request per test case, in turn).")
    memory_limit_mb: int = option(1024, "Memory limit of one run on the service, in MB.")


@dataclass
class RewardModelConfig:
    """The reward-model worker, and how rule-based rewards are computed from the scorers (verl's reward managers)."""

    enable: bool = option(
        False,
        "Score every response with a learned reward model (reward_model.model.path, or the Python API's "
        "reward_models=[...]); the step's score is reward_weight x RM score + rule_weight x rule score.",
    )
    model: RewardModelModelConfig = option(RewardModelModelConfig, "The reward model's checkpoint.")
    sandbox_fusion: SandboxFusionConfig = option(SandboxFusionConfig, "Score code by running it on a SandboxFusion service.")
    generative: GenerativeRewardModelConfig = option(GenerativeRewardModelConfig, "An LLM judge as the reward model.")
    strategy: str = option("fsdp", "How the reward model is sharded over its devices: fsdp or fsdp2 (both FSDP2 here).")
    micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per scoring pass on one device; null = the whole per-device share at once.", check=AT_LEAST_1
    )
    use_dynamic_bsz: bool = option(False, "Scoring passes cut by forward_max_token_len_per_gpu tokens instead.")
    forward_max_token_len_per_gpu: int = option(
        32768, "With use_dynamic_bsz: most real tokens in one scoring pass.", check=AT_LEAST_1
    )
    enable_resource_pool: bool = option(
        False,
        "verl's spelling of split placement: the reward model on n_gpus_per_node x nnodes devices of its own "
        "(the same as resource_pool.reward_model=n_gpus_per_node).",
    )
    n_gpus_per_node: int = option(8, "With enable_resource_pool: devices per node of the reward model's pool.", check=AT_LEAST_1)
    nnodes: int = option(0, "With enable_resource_pool: nodes of the reward model's pool; 0 = trainer.nnodes.", check=AT_LEAST_0)
    reward_weight: float = option(1.0, "Weight of the reward model's score in the step's score.")
    rule_weight: float = option(
        0.0,
        "Weight of the rule-based (or custom) score when the reward model is enabled. 0 = verl's semantics (the RM "
        "score replaces the rule score); the rule score is still computed and logged as reward_model/rule_score/mean.",
    )
    reward_manager: str = option(
        "naive",
        "naive: one scorer call per response; dapo: as naive, the EOS text stripped from the response, plus "
        "the overlong penalty; batch: one call of the custom function with lists for the whole batch; prime: one call "
        "per response in parallel processes (docs/algorithms.md).",
    )
    overlong_buffer: OverlongBufferConfig = option(OverlongBufferConfig, "DAPO overlong reward shaping.")
    launch_reward_fn_async: bool = option(
        False,
        "Score the responses (the reward function, remote scorers) in a background thread while the old log-prob, "
        "reference and value passes run; the step joins the scores before the advantages. The same scores; it saves "
        "the scoring time up to those passes' time (timing_s/reward is then the wait, reward/score_s the scoring). "
        "Not with algorithm.filter_groups or trainer.mode other than sync (they need the scores at once). With the "
        "native engine in-process (one device), each response is scored as it ends, while the others decode "
        "(stream_reward_fn).",
    )
    stream_reward_fn: bool = option(
        True,
        "With launch_reward_fn_async and the native engine in-process: score each response as soon as it ends, while "
        "the others decode, when the scorer is a reward function in worker processes (custom_reward_function.path or "
        "one given to the Python API, not batched) or a scoring service (custom_reward_function.remote.url: its requests) "
        "(reward/streamed_fraction). The same scores; false scores after generation. The built-in scorers, fast and run "
        "in threads of the trainer, are always scored after generation. A service's requests, made by a helper process, "
        "slow decoding by ~8% (docs/performance.md): for one that answers within the log-prob passes, false is faster.",
    )


@dataclass
class KLCtrlConfig:
    """Controller of the KL penalty coefficient in the reward."""

    type: str = option("fixed", "Keep the coefficient fixed, or adapt it towards target_kl.", choices=KL_CTRL_TYPES)
    kl_coef: float = option(0.001, "(Initial) KL penalty coefficient.", check=AT_LEAST_0)
    target_kl: float = option(0.1, "KL the adaptive controller steers towards.", check=POSITIVE)
    horizon: int = option(10000, "Adaptive controller horizon, in samples.", check=AT_LEAST_1)


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: train only on prompts whose samples disagree (docs/algorithms.md)."""

    enable: bool = option(
        False,
        "Drop every prompt whose rollout.n samples all have the same `metric`, and generate "
        "more prompts (data.gen_batch_size at a time) until data.train_batch_size prompts remain.",
    )
    metric: str | None = option(
        None,
        "What must vary within a prompt's samples: acc (or score: the scorer's score), seq_reward (the sum of the "
        "token rewards), seq_final_reward, or another numeric key the reward function returns; null = acc.",
    )
    max_num_gen_batches: int = option(0, "Give up with an error after this many generation rounds in one step; <= 0 = no limit.")


@dataclass
class RolloutCorrectionConfig:
    """Correction of the mismatch between the rollout engine's and the trainer's log-probs (verl's keys)."""

    rollout_is: str | None = option(
        None, "Truncated importance-sampling weights pi_old / pi_rollout per token or per sequence; null = off."
    )
    rollout_is_threshold: float = option(2.0, "Upper bound of the importance weights (truncation).")
    rollout_is_batch_normalize: bool = option(False, "Scale the weights so that they average 1 over the batch.")
    rollout_rs: str | None = option(
        None,
        "Rejection: comma-separated criteria that every token / sequence must pass to stay in the loss, e.g. "
        "token_k1, seq_mean_k1 (geometric mean ratio), seq_max_k2 (docs/algorithms.md); null = off.",
    )
    rollout_rs_threshold: str | float | None = option(
        None,
        "Bounds of the rollout_rs criteria, one per criterion (comma-separated) or one for all: lower_upper or "
        "one number u = [1/u, u] for k1 criteria, an upper bound for k2/k3.",
    )
    bypass_mode: bool = option(
        False, "Use the engine's log-probs as the old log-probs instead of recomputing them (no correction then)."
    )
    loss_type: str = option("ppo_clip", "Policy loss in bypass mode: ppo_clip (the configured policy loss).")


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the KL penalty in the reward."""

    adv_estimator: str = option(
        "gae",
        "Advantage estimator by its registered name (docs/algorithms.md); gae trains a critic, the others do not. "
        "Your own: hybridrl.algorithms.register_adv_estimator in a file listed in `extensions`.",
    )
    gamma: float = option(1.0, "Discount factor.", check=UNIT)
    lam: float = option(1.0, "GAE lambda.", check=UNIT)
    norm_adv_by_std_in_grpo: bool = option(True, "GRPO: divide advantages by the group's standard deviation.")
    use_kl_in_reward: bool = option(False, "Subtract a KL(policy || reference) penalty from the reward.")
    kl_penalty: str = option("kl", "KL estimator for the in-reward penalty.", choices=KL_ESTIMATORS)
    kl_ctrl: KLCtrlConfig = option(KLCtrlConfig, "KL coefficient controller.")
    filter_groups: FilterGroupsConfig = option(FilterGroupsConfig, "DAPO dynamic sampling.")
    rollout_correction: RolloutCorrectionConfig = option(
        RolloutCorrectionConfig, "Train/rollout mismatch correction; its metrics (rollout_corr/...) are always logged."
    )
    name: str = option(
        "rl",
        "Training algorithm: rl = the RL loop (PPO, GRPO, ... by adv_estimator); dpo, kto = preference "
        "optimization (see `preference`); sft = supervised fine-tuning on the responses; rm = reward-model training "
        "(Bradley-Terry on chosen/rejected pairs, docs/reward_models.md).",
        choices=ALGORITHM_NAMES,
    )


# --------------------------------------------------------------------------- trainer, warm-up


@dataclass
class TrainerConfig:
    """Run length, devices, logging, checkpoints."""

    project_name: str = option("hybridrl", "Project name (logger grouping, output directory).")
    experiment_name: str = option("run", "Run name (logger run name, output directory).")
    total_epochs: int = option(1, "Passes over the training prompts.", check=AT_LEAST_1)
    total_training_steps: int | None = option(
        None, "Stop after this many steps; overrides total_epochs when set.", check=AT_LEAST_1
    )
    n_gpus_per_node: int = option(1, "Devices (worker processes) per node.", check=AT_LEAST_1)
    nnodes: int = option(1, "Nodes.", check=AT_LEAST_1)
    device: str = option("auto", "Device type; auto = cuda when available, else cpu.", choices=DEVICES)
    cpu_threads: int = option(
        0,
        "torch's CPU threads per worker process. 0 = auto: 2 for a GPU worker (its host only packs batches and "
        "queues kernels; a pool of every core stalls it and its neighbours), and for CPU runs the cores this "
        "process owns (affinity, cgroup quota) split between the node's worker processes; -1 = torch's default "
        "(every core); N = N. docs/performance.md, 'Sharing a node'.",
        check=THREADS,
    )
    save_freq: int = option(-1, "Save a checkpoint every N steps; -1 = only at the end.", check=OFF_OR_1)
    test_freq: int = option(-1, "Validate every N steps; -1 = only at the end (when data.val_files is set).", check=OFF_OR_1)
    val_before_train: bool = option(True, "Validate once before the first step.")
    logger: list[str] = option(
        ["console", "jsonl", "tensorboard"],
        "Where metrics go: console, jsonl (or file, verl's name for it), tensorboard, "
        "wandb, mlflow, swanlab. metrics.jsonl is written in any case (hybridrl report and dashboard read it).",
        choices=LOGGERS,
    )
    default_local_dir: str | None = option(None, "Output directory; null = runs/<project_name>/<experiment_name>.")
    resume_mode: str = option(
        "auto", "auto = resume from the latest checkpoint if any; resume_path = from resume_from_path.", choices=RESUME_MODES
    )
    resume_from_path: str | None = option(None, "Checkpoint directory to resume from (resume_mode=resume_path).")
    overwrite: bool = option(
        False,
        "A new run (nothing to resume) into a directory holding another run: true moves the old run aside to "
        "<dir>.old-<timestamp> (never deletes it); false stops with an error naming the choices.",
    )
    seed: int = option(1, "Random seed.")
    max_nonfinite_steps: int = option(
        3, "Consecutive steps with NaN/inf loss that are skipped before the run stops.", check=AT_LEAST_0
    )
    log_samples: int = option(
        4,
        "Prompts per training step written to samples.jsonl with all n of their responses, the ground truth, "
        "scores and advantages (the report's rollout inspector); 0 = none.",
        check=AT_LEAST_0,
    )
    log_val_samples: int = option(
        8, "Prompts per validation written to samples.jsonl with their responses and scores; 0 = none.", check=AT_LEAST_0
    )
    rollout_data_dir: str | None = option(
        None,
        "verl's key: dump every training sample of every step to <dir>/<step>.jsonl (input, output, gts, score, "
        "step, advantage, data_source, uid); null = off.",
    )
    validation_data_dir: str | None = option(
        None, "verl's key: dump every validation sample to <dir>/<step>.jsonl (same fields as rollout_data_dir); null = off."
    )
    max_ckpt_to_keep: int | None = option(None, "Keep only the newest N checkpoints; null = keep all.", check=AT_LEAST_1)
    max_wall_time_s: float | None = option(
        None,
        "Stop after the first step that ends this many seconds after start-up (validating and saving as at "
        "the last step); counted per launch, so a resumed run gets a fresh budget. null = no limit.",
        check=POSITIVE,
    )
    worker_timeout_s: float = option(
        60.0,
        "Ray backend: a worker process that sends no heartbeat for this many seconds while the controller waits "
        "on it (stopped, frozen node) is reported like a dead one (and restarted with max_restarts); also how long a "
        "run on trainer.nnodes > 1 waits for missing nodes to join (at start, and for a lost node's replacement).",
    )
    max_restarts: int = option(
        0,
        "When a worker process dies: restart the worker groups and resume from the last checkpoint, at most N times.",
        check=AT_LEAST_0,
    )
    critic_warmup: int = option(
        0, "Train only the critic until this step: the actor first updates at step max(1, critic_warmup), as in verl."
    )
    mode: str = option(
        "sync",
        "sync = generate then train on the same policy (the default); one_step_off = train on the batch generated "
        "one update earlier while the next one is generated; async = up to async_training.max_staleness batches "
        "ahead. Off-policy samples are corrected in the loss (algorithm.rollout_correction; docs/async.md).",
        choices=TRAINER_MODES,
    )
    deterministic: bool = option(
        False,
        "Deterministic kernels on the GPU (torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG, cuDNN): two "
        "runs with the same seed log identical metrics on one GPU in sync mode, at some speed (docs/reliability.md).",
    )
    profile_steps: list[int] = option(
        [],
        "Steps to profile with torch.profiler in every worker process: a Chrome/Perfetto trace and a table of "
        "the ops with the most device time per process, in <run dir>/profile/step_N/ (docs/performance.md).",
    )


@dataclass
class AsyncTrainingConfig:
    """Off-policy training (trainer.mode one_step_off / async): how stale a sample may be (verl's async_training block)."""

    max_staleness: int = option(
        1,
        "trainer.mode=async: batches generated ahead of the trainer, so a sample is trained on by a policy at most this "
        "many updates newer than the one that generated it; one_step_off is 1.",
        check=AT_LEAST_1,
    )
    partial_rollout: bool = option(
        False,
        "With resource_pool.rollout and trainer.mode one_step_off / async: weights the actor sends while the pool is "
        "generating are loaded between two decode steps and the sequences go on with them (the tokens so far and "
        "their KV cache stay); rollout_token_version records which weights sampled each token. Native engine, "
        "single-turn.",
    )


@dataclass
class ResourcePoolConfig:
    """Which devices each role runs on (docs/distributed.md). All null = colocated: every role
    shares every device, in one process per device."""

    actor_rollout_ref: int | None = option(
        None, "Devices per node for the actor, rollout and reference; null = all of trainer.n_gpus_per_node.", check=AT_LEAST_1
    )
    critic: int | None = option(
        None,
        "Devices per node for the critic, apart from the actor's (split placement); null = share the actor's.",
        check=AT_LEAST_1,
    )
    reward_model: int | None = option(
        None,
        "Devices per node for the reward model (reward_model.enable), apart from the actor's and the critic's (split "
        "placement); null = share the actor's (or reward_model.enable_resource_pool's n_gpus_per_node).",
        check=AT_LEAST_1,
    )
    rollout: int | str | None = option(
        None,
        "Devices per node for rollout replicas apart from the actor's (verl's standalone rollout, "
        "hybrid_engine=false): they generate while the actor trains (trainer.mode one_step_off / async) and get "
        "the weights from the actor's rank 0 over NCCL/gloo after each update; null = the actor generates; auto = "
        "chosen from the first steps' measured times, run colocated in sync mode (docs/async.md).",
        check=ROLLOUT_DEVICES,
    )
    rollout_auto_steps: int = option(
        2,
        "With resource_pool.rollout=auto: the training steps run colocated in sync mode to measure generation against "
        "the rest of a step (the first one's warm-up is left out of the mean when there are two or more).",
        check=AT_LEAST_1,
    )
    rollout_auto_min_gain: float = option(
        0.1,
        "With resource_pool.rollout=auto: how much faster than colocated sync (a fraction of its step time) a split "
        "must be predicted to be taken; a negative value takes the best split even when predicted slower (to measure "
        "it against colocated).",
        check=BELOW_1,
    )


@dataclass
class RayInitConfig:
    """How the driver joins Ray (used when there is more than one device or an address)."""

    address: str | None = option(
        None,
        "Address of a running Ray cluster (ray start --head prints it), or auto; null = the RAY_ADDRESS "
        "environment variable, else start a local cluster when trainer.nnodes x n_gpus_per_node > 1.",
    )
    num_cpus: int | None = option(
        None, "CPUs of a local cluster the driver starts; null = all of the machine's.", check=AT_LEAST_1
    )
    kwargs: dict = option(
        {},
        "Further keyword arguments for ray.init (verl's ray_kwargs.ray_init.*, e.g. runtime_env); address and "
        "num_cpus above take precedence.",
    )


@dataclass
class WarmupConfig:
    """Optional supervised warm-up of the policy before RL (the quickstart uses it)."""

    steps: int = option(0, "Supervised optimizer steps before RL; 0 = off.", check=AT_LEAST_0)
    files: str | list[str] | None = option(None, "Rows with the prompt and a `response` column (parquet or jsonl).")
    batch_size: int = option(64, "Rows per warm-up step.", check=AT_LEAST_1)
    lr: float = option(1e-3, "Warm-up learning rate.", check=POSITIVE)


@dataclass
class PreferenceConfig:
    """DPO and KTO (algorithm.name=dpo|kto): the loss and the reference log-probs."""

    loss_type: str = option("sigmoid", "DPO loss: sigmoid (DPO), ipo (IPO) or hinge (SLiC).", choices=DPO_LOSS_TYPES)
    beta: float = option(0.1, "Strength of the implicit KL to the reference (DPO and KTO beta).", check=POSITIVE)
    label_smoothing: float = option(
        0.0,
        "DPO sigmoid loss only: assumed probability that a preference label is flipped (cDPO); < 0.5.",
        check=Rule(lambda v: 0 <= v < 0.5, "must be in [0, 0.5)"),
    )
    desirable_weight: float = option(1.0, "KTO: weight of the loss on desirable (label true) examples.", check=POSITIVE)
    undesirable_weight: float = option(1.0, "KTO: weight of the loss on undesirable (label false) examples.", check=POSITIVE)
    precompute_ref_log_probs: bool = option(
        False, "Compute the reference log-probs of the whole training set once before training, instead of per step."
    )


@dataclass
class Config:
    """A whole hybridrl run."""

    data: DataConfig = option(DataConfig, "Prompts and lengths.")
    actor_rollout_ref: ActorRolloutRefConfig = option(ActorRolloutRefConfig, "Policy: actor, rollout, reference.")
    critic: CriticConfig = option(CriticConfig, "Value function (PPO with GAE).")
    custom_reward_function: CustomRewardConfig = option(CustomRewardConfig, "Reward function of your own.")
    reward_model: RewardModelConfig = option(RewardModelConfig, "Reward-model worker, reward manager, DAPO overlong shaping.")
    algorithm: AlgorithmConfig = option(AlgorithmConfig, "Advantages and KL penalty.")
    trainer: TrainerConfig = option(TrainerConfig, "Run length, devices, logging, checkpoints.")
    warmup: WarmupConfig = option(WarmupConfig, "Supervised warm-up before RL.")
    preference: PreferenceConfig = option(PreferenceConfig, "DPO / KTO loss (algorithm.name=dpo|kto).")
    async_training: AsyncTrainingConfig = option(AsyncTrainingConfig, "Staleness bound of trainer.mode=async.")
    resource_pool: ResourcePoolConfig = option(ResourcePoolConfig, "Devices of each role: colocated or split.")
    ray_init: RayInitConfig = option(RayInitConfig, "Joining or starting a Ray cluster.")
    extensions: list[str] = option(
        [],
        "Python files (path/to/file.py) or module names imported when the config is loaded, before it is checked, "
        "and in every worker process: register your own advantage estimators and policy losses there, then select them "
        "by name (docs/algorithms.md).",
    )

    # What loading changed or ignored (verl keys, parallelism notices, warnings), shown once at start.
    notices: ClassVar[tuple[str, ...]] = ()

    @property
    def critic_enabled(self) -> bool:
        """Only GAE needs a learned value function; the other estimators use group baselines."""
        return self.algorithm.name == "rl" and self.algorithm.adv_estimator == "gae"

    @property
    def reward_model_pool(self) -> tuple[int, int] | None:
        """(devices per node, nodes) of the reward model's own pool, or None when it shares the actor's:
        resource_pool.reward_model, or verl's reward_model.enable_resource_pool with its n_gpus_per_node/nnodes."""
        rm, pool = self.reward_model, self.resource_pool
        if pool.reward_model:
            return pool.reward_model, self.trainer.nnodes
        if rm.enable_resource_pool and rm.n_gpus_per_node:
            return rm.n_gpus_per_node, rm.nnodes or self.trainer.nnodes
        return None


def resolve(cfg: Config) -> Config:
    """Fill every "null = inherit" field with the value it stands for, in place; returns cfg.

    Idempotent: only None values are replaced, so a saved resolved config loads unchanged.
    """
    model, actor, critic = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.actor, cfg.critic
    if actor.clip_ratio_low is None:
        actor.clip_ratio_low = actor.clip_ratio
    if actor.clip_ratio_high is None:
        actor.clip_ratio_high = actor.clip_ratio
    if model.tokenizer_path is None and model.path:
        model.tokenizer_path = model.path
    if critic.model.path is None and model.path:
        critic.model.path = model.path
    if critic.model.tokenizer_path is None and model.tokenizer_path:
        critic.model.tokenizer_path = model.tokenizer_path
    if critic.ppo_mini_batch_size is None:
        critic.ppo_mini_batch_size = actor.ppo_mini_batch_size
    if critic.ppo_epochs is None:
        critic.ppo_epochs = actor.ppo_epochs
    if critic.use_dynamic_bsz is None:  # verl: critic.use_dynamic_bsz follows the actor's
        critic.use_dynamic_bsz = actor.use_dynamic_bsz
    if critic.loss_agg_mode is None:
        critic.loss_agg_mode = actor.loss_agg_mode
    if cfg.data.seed is None:
        cfg.data.seed = cfg.trainer.seed
    if critic.forward_max_token_len_per_gpu is None:
        critic.forward_max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
    for part in (cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref):  # log-prob passes follow the actor
        if part.log_prob_use_dynamic_bsz is None:
            part.log_prob_use_dynamic_bsz = actor.use_dynamic_bsz
        if part.log_prob_max_token_len_per_gpu is None:
            part.log_prob_max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
    kwargs = cfg.custom_reward_function.reward_kwargs
    if isinstance(kwargs.get("overlong_buffer_cfg"), dict):  # the DAPO recipe's form configures the manager
        for name, value in kwargs.pop("overlong_buffer_cfg").items():
            setattr(cfg.reward_model.overlong_buffer, name, value)
    kwargs.pop("max_resp_len", None)  # DAPO recipe: always data.max_response_length (checked in validation)
    if cfg.trainer.default_local_dir is None:
        cfg.trainer.default_local_dir = f"runs/{cfg.trainer.project_name}/{cfg.trainer.experiment_name}"
    return cfg


class Entry(NamedTuple):
    """One key of the tree, as `walk` reports it."""

    path: str  # dotted, e.g. "actor_rollout_ref.actor.optim.lr"
    type: Any  # the annotation, e.g. float | None
    doc: str
    value: Any  # the value in the walked object
    is_section: bool  # a component (dataclass) rather than a leaf
    check: Any = None  # the range rule declared with `option(check=)`, or None
    choices: tuple[str, ...] | None = None  # the names declared with `option(choices=)`, or None


def walk(obj: Any, prefix: str = "") -> Iterator[Entry]:
    """Every key under a config object, each section before its contents, in declaration order."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        section = dataclasses.is_dataclass(f.type)
        meta = f.metadata
        yield Entry(prefix + f.name, f.type, meta.get("doc", ""), value, section, meta.get("check"), meta.get("choices"))
        if section:
            yield from walk(value, f"{prefix}{f.name}.")


def type_name(tp: Any) -> str:
    """How an annotation reads in messages and docs: `int | None`, `list[str]`."""
    if tp is type(None):
        return "null"
    args, origin = typing.get_args(tp), typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def show(value: Any) -> str:
    """A value as it would be written in YAML or an override: null, true, 1e-06, [a, b]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return repr(value)


class ConfigError(ValueError):
    """Every problem found in a config at once; `.errors` lists them one per string."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"{len(self.errors)} problem(s) in the config:\n{lines}")
