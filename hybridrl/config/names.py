"""Every set of allowed names a config key takes, in one torch-free module.

The config layer imports nothing from the layers above it, so it cannot read the registries it
mirrors at import time without pulling in torch. Each set below names the registry it copies;
`tests/config/test_names.py` imports both and fails when they differ, so a name added to a
registry cannot be refused by validation (or a removed one accepted) without a red test. Where a
registry is a plain tuple (the KL estimators, DPO losses, reward managers, rollout-correction
levels), its module imports the tuple from here instead, so it is written once.
Names users register themselves (advantage estimators, policy losses) are not here: they are
read from the live registries through `extensions.use_registry`.
"""

ALGORITHM_NAMES = ("rl", "dpo", "kto", "sft", "rm")  # "rl" + hybridrl.data.preference.KINDS
PREFERENCE_ALGORITHMS = ("dpo", "kto")  # need a frozen reference policy
TRUNCATIONS = ("error", "left", "right", "middle")  # hybridrl.data.dataset.TRUNCATION_MODES
LOSS_AGG_MODES = (  # hybridrl.algorithms.losses.LOSS_AGG_MODES
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")  # hybridrl.algorithms.kl.KL_TYPES imports it
DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")  # hybridrl.algorithms.preference.DPO_LOSS_TYPES
ROLLOUT_IS_LEVELS = ("token", "sequence")  # hybridrl.algorithms.rollout_correction.ROLLOUT_IS_LEVELS
ROLLOUT_RS_OPTIONS = (  # hybridrl.algorithms.rollout_correction.ROLLOUT_RS_OPTIONS
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
REWARD_MANAGERS = ("naive", "dapo", "batch", "prime")  # hybridrl.rewards.assembly.REWARD_MANAGERS
LOGGERS = ("console", "jsonl", "file", "tensorboard", "wandb", "mlflow", "swanlab")  # hybridrl.tracking.tracker.LOGGERS
PACKED_ATTN_BACKENDS = ("auto", "varlen", "flex", "sdpa")  # hybridrl.models.packing.BACKENDS
TOOL_CALL_FORMATS = ("hermes", "code")  # hybridrl.rollout.agent.parser.FORMATS
TRAINER_MODES = ("sync", "one_step_off", "async")  # hybridrl.trainer.async_rollout.depth

# Names with no registry of their own: the config is where they are defined.
ROLLOUT_NAMES = ("auto", "native", "hf", "vllm")
ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")  # verl's actor.router_replay.mode (workers/moe_passes.py)
KL_CTRL_TYPES = ("fixed", "adaptive")
LR_SCHEDULERS = ("constant", "cosine")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")
TRUNCATE_SIDES = ("left", "middle", "right")
REWARD_MODEL_STRATEGIES = ("fsdp", "fsdp2")
WEIGHT_STAGINGS = ("auto", "device", "host")  # hybridrl.distributed.weight_staging imports it

# Baselines from the other responses to the same prompt: RLOO needs n > 1 (leave-one-out over
# nothing otherwise); GRPO with n = 1 runs as verl's does (a group of one: mean 0, std 1, so the
# advantage is the score itself), with a warning (`config_notices`).
GROUP_ESTIMATORS = ("rloo",)
