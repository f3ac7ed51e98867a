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
from typing import Any, Iterator, NamedTuple


def option(default: Any, doc: str) -> Any:
    """A dataclass field with its one-place documentation.

    `default` may be a plain value, a list/dict (copied per instance) or a zero-argument
    callable such as a component class (called per instance).
    """
    meta = {"doc": doc}
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
    val_files: str | list[str] | None = option(None, "Validation prompts (same format); null = no validation.")
    prompt_key: str = option("prompt", "Column holding the prompt (a string or a list of chat messages).")
    reward_fn_key: str = option("data_source", "Column that selects the reward function for each row.")
    max_prompt_length: int = option(512, "Longest prompt in tokens; longer ones are handled per `truncation`.")
    max_response_length: int = option(512, "Most tokens generated per response.")
    train_batch_size: int = option(256, "Prompts per training step (before `rollout.n` samples each).")
    val_batch_size: int | None = option(None, "Prompts per validation batch; null = the whole validation set at once.")
    val_max_samples: int | None = option(None, "Use only the first N validation rows; null = all of them.")
    truncation: str = option("error", "A prompt over max_prompt_length: raise, or cut tokens from the left or right.")
    shuffle: bool = option(True, "Shuffle the training prompts every epoch.")


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
        "auto", "Attention kernel of packed passes: auto (fastest measured: varlen on GPU, sdpa on CPU), varlen, flex, sdpa."
    )
    lora_rank: int = option(0, "LoRA rank (peft); 0 = full fine-tuning. The reference policy is the base, adapters off.")
    lora_alpha: int = option(16, "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank.")
    target_modules: str | list[str] = option(
        "all-linear", "Modules that get LoRA adapters: all-linear (every linear layer but the LM head) or a list of names."
    )


@dataclass
class OptimConfig:
    """AdamW with a warm-up then a constant or cosine learning rate."""

    lr: float = option(1e-6, "Peak learning rate.")
    weight_decay: float = option(0.01, "AdamW weight decay.")
    betas: list[float] = option([0.9, 0.999], "AdamW (beta1, beta2).")
    warmup_steps_ratio: float = option(0.0, "Warm-up length as a fraction of the total optimizer steps.")
    lr_warmup_steps: int = option(-1, "Warm-up length in optimizer steps; a value >= 0 overrides warmup_steps_ratio.")
    lr_scheduler_type: str = option("constant", "Learning-rate shape after warm-up.")
    min_lr_ratio: float = option(0.0, "Cosine schedule floor as a fraction of `lr`.")


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)


@dataclass
class FSDPConfig:
    """FSDP2 sharding of a model over several devices (no effect on one device or on CPU)."""

    param_offload: bool = option(
        False, "Keep the sharded weights and gradients in CPU memory (FSDP2 CPUOffloadPolicy); each block is copied "
        "to the GPU for its forward/backward, and the optimizer step runs on the CPU. Saves the most GPU memory."
    )
    optimizer_offload: bool = option(
        False, "Keep the optimizer state (Adam moments) in CPU memory between optimizer steps; it is copied to the "
        "GPU for each step only. Implied by param_offload."
    )
    fsdp_size: int = option(
        -1, "Ranks in one FSDP shard group (verl's meaning): -1 = shard over all of the role's ranks; a divisor of "
        "them = shard within groups of that size and replicate across the groups (HSDP: less communication between "
        "nodes, more memory per device). The reference and a colocated critic use the actor's value."
    )


@dataclass
class ActorConfig:
    """The policy update: PPO-style clipped loss, optional KL loss and entropy bonus."""

    ppo_mini_batch_size: int = option(
        64, "Prompts per optimizer step; each brings `rollout.n` sequences. Must divide data.train_batch_size."
    )
    ppo_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward/backward pass on one device; null = the whole per-device mini-batch."
    )
    ppo_epochs: int = option(1, "Passes over each step's rollouts.")
    shuffle: bool = option(False, "Shuffle the rollouts before splitting them into mini-batches.")
    clip_ratio: float = option(0.2, "PPO clip range epsilon for the importance ratio.")
    clip_ratio_low: float | None = option(None, "Lower clip range (1 - low); null = clip_ratio.")
    clip_ratio_high: float | None = option(None, "Upper clip range (1 + high); null = clip_ratio. DAPO raises it.")
    clip_ratio_c: float = option(3.0, "Dual-clip bound for negative advantages; must be > 1.")
    loss_agg_mode: str = option("token-mean", "How per-token losses are averaged into one number.")
    entropy_coeff: float = option(0.0, "Weight of the entropy bonus (0 = off).")
    use_kl_loss: bool = option(False, "Add a KL(policy || reference) term to the actor loss (GRPO-style).")
    kl_loss_coef: float = option(0.001, "Weight of the KL loss term.")
    kl_loss_type: str = option("low_var_kl", "KL estimator for the KL loss.")
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value.")
    use_dynamic_bsz: bool = option(
        False, "Micro-batches by token budget (ppo_max_token_len_per_gpu) instead of ppo_micro_batch_size_per_gpu."
    )
    ppo_max_token_len_per_gpu: int = option(
        16384, "With use_dynamic_bsz: most real tokens (prompt + response) in one forward/backward pass on one device."
    )
    use_torch_compile: bool = option(
        True, "torch.compile the policy's decoder layers on CUDA (faster, BENCHMARKS.md); CPU runs stay eager."
    )
    optim: OptimConfig = option(OptimConfig, "Actor optimizer.")
    fsdp_config: FSDPConfig = option(FSDPConfig, "Sharding of the policy over several devices.")


@dataclass
class ValKwargsConfig:
    """Sampling used for validation."""

    n: int = option(1, "Samples per validation prompt.")
    do_sample: bool = option(False, "Sample (true) or decode greedily (false).")
    temperature: float = option(0.0, "Sampling temperature.")
    top_p: float = option(1.0, "Nucleus sampling mass.")
    top_k: int = option(-1, "Keep only the k most likely tokens; -1 = off.")


@dataclass
class RolloutConfig:
    """Generation of responses during training."""

    name: str = option(
        "auto", "Generation engine: native (paged KV cache, continuous batching, CUDA graphs; Llama/Qwen2/Qwen3 "
        "family, others fall back to hf), hf (transformers generate), vllm (only where vLLM is installed); "
        "auto = native on a GPU, hf on CPU."
    )
    n: int = option(1, "Responses sampled per prompt (the group size for GRPO/RLOO).")
    temperature: float = option(1.0, "Sampling temperature.")
    top_p: float = option(1.0, "Nucleus sampling mass.")
    top_k: int = option(-1, "Keep only the k most likely tokens; -1 = off.")
    do_sample: bool = option(True, "Sample (true) or decode greedily (false).")
    max_num_seqs: int = option(256, "Sequences one device generates together.")
    gpu_memory_utilization: float = option(
        0.5, "native: fraction of the GPU memory free at wake-up (after the trainer and the engine's weights) "
        "that the KV cache and decode workspace may take."
    )
    enforce_eager: bool = option(False, "native: decode without CUDA graphs (slower; for debugging).")
    free_cache_engine: bool = option(True, "native: free the KV cache after each generation so training gets the memory.")
    max_num_batched_tokens: int = option(8192, "native: prompt tokens (padded) prefilled in one forward pass.")
    log_prob_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward pass when recomputing old log-probs; null = all of a device's sequences."
    )
    log_prob_use_dynamic_bsz: bool | None = option(
        None, "Old log-prob passes by token budget; null = actor.use_dynamic_bsz."
    )
    log_prob_max_token_len_per_gpu: int | None = option(
        None, "Token budget of one old log-prob pass; null = actor.ppo_max_token_len_per_gpu."
    )
    val_kwargs: ValKwargsConfig = option(ValKwargsConfig, "Sampling for validation.")


@dataclass
class RefConfig:
    """The frozen reference policy (used only when a KL term is on)."""

    log_prob_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward pass for reference log-probs; null = all of a device's sequences."
    )
    fsdp_config: FSDPConfig = option(FSDPConfig, "Sharding of the reference (only param_offload applies: no optimizer).")
    log_prob_use_dynamic_bsz: bool | None = option(
        None, "Reference log-prob passes by token budget; null = actor.use_dynamic_bsz."
    )
    log_prob_max_token_len_per_gpu: int | None = option(
        None, "Token budget of one reference log-prob pass; null = actor.ppo_max_token_len_per_gpu."
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


@dataclass
class CriticConfig:
    """The value function; trained only when algorithm.adv_estimator=gae."""

    model: CriticModelConfig = option(CriticModelConfig, "The value model.")
    optim: OptimConfig = option(_critic_optim, "Critic optimizer.")
    ppo_mini_batch_size: int | None = option(None, "Prompts per critic optimizer step; null = the actor's.")
    ppo_micro_batch_size_per_gpu: int | None = option(
        None, "Sequences per forward/backward pass on one device; null = the whole per-device mini-batch."
    )
    ppo_epochs: int | None = option(None, "Passes over each step's rollouts; null = the actor's.")
    use_dynamic_bsz: bool = option(False, "Micro-batches by token budget instead of ppo_micro_batch_size_per_gpu.")
    ppo_max_token_len_per_gpu: int = option(
        32768, "With use_dynamic_bsz: most real tokens in one forward/backward pass of the critic on one device."
    )
    forward_max_token_len_per_gpu: int | None = option(
        None, "With use_dynamic_bsz: token budget of one value (forward-only) pass; null = ppo_max_token_len_per_gpu."
    )
    cliprange_value: float = option(0.5, "Clip range of the value update around the old values.")
    loss_agg_mode: str = option("token-mean", "How per-token value losses are averaged.")
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value.")


# --------------------------------------------------------------------------- reward, algorithm


@dataclass
class CustomRewardConfig:
    """A reward function of your own, loaded from a Python file."""

    path: str | None = option(None, "Python file defining the reward function; null = the built-in scorers.")
    name: str = option("compute_score", "Name of the function in that file.")
    reward_kwargs: dict = option(
        {}, "Keyword arguments for the reward function, built-in or custom; e.g. {format_score: 0.1} gives a "
        "well-formed but wrong GSM8K answer 0.1."
    )


@dataclass
class KLCtrlConfig:
    """Controller of the KL penalty coefficient in the reward."""

    type: str = option("fixed", "Keep the coefficient fixed, or adapt it towards target_kl.")
    kl_coef: float = option(0.001, "(Initial) KL penalty coefficient.")
    target_kl: float = option(0.1, "KL the adaptive controller steers towards.")
    horizon: int = option(10000, "Adaptive controller horizon, in samples.")


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the KL penalty in the reward."""

    adv_estimator: str = option("gae", "Advantage estimator; gae trains a critic, the others do not.")
    gamma: float = option(1.0, "Discount factor.")
    lam: float = option(1.0, "GAE lambda.")
    norm_adv_by_std_in_grpo: bool = option(True, "GRPO: divide advantages by the group's standard deviation.")
    use_kl_in_reward: bool = option(False, "Subtract a KL(policy || reference) penalty from the reward.")
    kl_penalty: str = option("kl", "KL estimator for the in-reward penalty.")
    kl_ctrl: KLCtrlConfig = option(KLCtrlConfig, "KL coefficient controller.")
    name: str = option(
        "rl", "Training algorithm: rl = the RL loop (PPO, GRPO, ... by adv_estimator); dpo, kto = preference "
        "optimization (see `preference`); sft = supervised fine-tuning on the responses."
    )


# --------------------------------------------------------------------------- trainer, warm-up


@dataclass
class TrainerConfig:
    """Run length, devices, logging, checkpoints."""

    project_name: str = option("hybridrl", "Project name (logger grouping, output directory).")
    experiment_name: str = option("run", "Run name (logger run name, output directory).")
    total_epochs: int = option(1, "Passes over the training prompts.")
    total_training_steps: int | None = option(None, "Stop after this many steps; overrides total_epochs when set.")
    n_gpus_per_node: int = option(1, "Devices (worker processes) per node.")
    nnodes: int = option(1, "Nodes.")
    device: str = option("auto", "Device type; auto = cuda when available, else cpu.")
    save_freq: int = option(-1, "Save a checkpoint every N steps; -1 = only at the end.")
    test_freq: int = option(-1, "Validate every N steps; -1 = only at the end (when data.val_files is set).")
    val_before_train: bool = option(True, "Validate once before the first step.")
    logger: list[str] = option(["console", "jsonl", "tensorboard"], "Where metrics go.")
    default_local_dir: str | None = option(None, "Output directory; null = runs/<project_name>/<experiment_name>.")
    resume_mode: str = option(
        "auto", "auto = resume from the latest checkpoint if any; resume_path = from resume_from_path."
    )
    resume_from_path: str | None = option(None, "Checkpoint directory to resume from (resume_mode=resume_path).")
    seed: int = option(1, "Random seed.")
    max_nonfinite_steps: int = option(3, "Consecutive steps with NaN/inf loss that are skipped before the run stops.")
    log_samples: int = option(4, "Prompt/response/score triples written to samples.jsonl per step.")
    max_ckpt_to_keep: int | None = option(None, "Keep only the newest N checkpoints; null = keep all.")
    max_wall_time_s: float | None = option(
        None, "Stop after the first step that ends this many seconds after start-up (validating and saving as at "
        "the last step); counted per launch, so a resumed run gets a fresh budget. null = no limit."
    )
    max_restarts: int = option(
        0, "When a worker process dies: restart the worker groups and resume from the last checkpoint, at most N times."
    )
    profile_steps: list[int] = option(
        [], "Steps to profile with torch.profiler in every worker process: a Chrome/Perfetto trace and a table of "
        "the ops with the most device time per process, in <run dir>/profile/step_N/ (docs/performance.md)."
    )


@dataclass
class ResourcePoolConfig:
    """Which devices each role runs on (docs/distributed.md). All null = colocated: every role
    shares every device, in one process per device."""

    actor_rollout_ref: int | None = option(
        None, "Devices per node for the actor, rollout and reference; null = all of trainer.n_gpus_per_node."
    )
    critic: int | None = option(
        None, "Devices per node for the critic, apart from the actor's (split placement); null = share the actor's."
    )


@dataclass
class RayInitConfig:
    """How the driver joins Ray (used when there is more than one device or an address)."""

    address: str | None = option(
        None, "Address of a running Ray cluster (ray start --head prints it), or auto; null = the RAY_ADDRESS "
        "environment variable, else start a local cluster when trainer.nnodes x n_gpus_per_node > 1."
    )
    num_cpus: int | None = option(None, "CPUs of a local cluster the driver starts; null = all of the machine's.")


@dataclass
class WarmupConfig:
    """Optional supervised warm-up of the policy before RL (the quickstart uses it)."""

    steps: int = option(0, "Supervised optimizer steps before RL; 0 = off.")
    files: str | list[str] | None = option(None, "Rows with the prompt and a `response` column (parquet or jsonl).")
    batch_size: int = option(64, "Rows per warm-up step.")
    lr: float = option(1e-3, "Warm-up learning rate.")


@dataclass
class PreferenceConfig:
    """DPO and KTO (algorithm.name=dpo|kto): the loss and the reference log-probs."""

    loss_type: str = option("sigmoid", "DPO loss: sigmoid (DPO), ipo (IPO) or hinge (SLiC).")
    beta: float = option(0.1, "Strength of the implicit KL to the reference (DPO and KTO beta).")
    label_smoothing: float = option(
        0.0, "DPO sigmoid loss only: assumed probability that a preference label is flipped (cDPO); < 0.5."
    )
    desirable_weight: float = option(1.0, "KTO: weight of the loss on desirable (label true) examples.")
    undesirable_weight: float = option(1.0, "KTO: weight of the loss on undesirable (label false) examples.")
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
    algorithm: AlgorithmConfig = option(AlgorithmConfig, "Advantages and KL penalty.")
    trainer: TrainerConfig = option(TrainerConfig, "Run length, devices, logging, checkpoints.")
    warmup: WarmupConfig = option(WarmupConfig, "Supervised warm-up before RL.")
    preference: PreferenceConfig = option(PreferenceConfig, "DPO / KTO loss (algorithm.name=dpo|kto).")
    resource_pool: ResourcePoolConfig = option(ResourcePoolConfig, "Devices of each role: colocated or split.")
    ray_init: RayInitConfig = option(RayInitConfig, "Joining or starting a Ray cluster.")

    @property
    def critic_enabled(self) -> bool:
        """Only GAE needs a learned value function; the other estimators use group baselines."""
        return self.algorithm.name == "rl" and self.algorithm.adv_estimator == "gae"


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
    if critic.forward_max_token_len_per_gpu is None:
        critic.forward_max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
    for part in (cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref):  # log-prob passes follow the actor
        if part.log_prob_use_dynamic_bsz is None:
            part.log_prob_use_dynamic_bsz = actor.use_dynamic_bsz
        if part.log_prob_max_token_len_per_gpu is None:
            part.log_prob_max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
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


def walk(obj: Any, prefix: str = "") -> Iterator[Entry]:
    """Every key under a config object, each section before its contents, in declaration order."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        section = dataclasses.is_dataclass(f.type)
        yield Entry(prefix + f.name, f.type, f.metadata.get("doc", ""), value, section)
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
