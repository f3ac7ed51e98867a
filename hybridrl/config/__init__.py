"""Typed config: schema (dataclasses), YAML + `a.b.c=value` overrides, validation, batch plan.

cfg = load_config("configs/gsm8k_grpo.yaml", ["data.train_batch_size=128"])
plan = plan_batches(cfg)      # per-device mini/micro batch sizes
print(explain(cfg))           # the same, as a table
"""

from .batch_plan import BatchPlan, RolePlan, plan_batches
from .explain import explain, explain_text
from .loader import config_from_dict, load_config, save_config, suggest_keys, to_dict
from .schema import (
    ActorConfig,
    ActorRolloutRefConfig,
    AlgorithmConfig,
    Config,
    ConfigError,
    CriticConfig,
    CriticModelConfig,
    CustomRewardConfig,
    DataConfig,
    KLCtrlConfig,
    ModelConfig,
    OptimConfig,
    PreferenceConfig,
    RefConfig,
    RolloutConfig,
    TrainerConfig,
    ValKwargsConfig,
    WarmupConfig,
    resolve,
)
from .validate import Problem, find_problems, validate

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "BatchPlan",
    "Config",
    "ConfigError",
    "CriticConfig",
    "CriticModelConfig",
    "CustomRewardConfig",
    "DataConfig",
    "KLCtrlConfig",
    "ModelConfig",
    "OptimConfig",
    "PreferenceConfig",
    "Problem",
    "RefConfig",
    "RolePlan",
    "RolloutConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "WarmupConfig",
    "config_from_dict",
    "explain",
    "explain_text",
    "find_problems",
    "load_config",
    "plan_batches",
    "resolve",
    "save_config",
    "suggest_keys",
    "to_dict",
    "validate",
]
