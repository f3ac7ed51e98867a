"""verl's command lines in hybridrl's terms: `python -m hybridrl.main_ppo | main_dapo | sft_trainer`.

Each takes the argv of its verl counterpart (`verl.trainer.main_ppo`, `recipe.dapo.main_dapo`,
`verl.trainer.fsdp_sft_trainer`): Hydra overrides (`key=value`, `+key=value`, `++key=value`,
`~key`) plus Hydra's `--config-path` / `--config-name`. `train_args` turns one into the arguments of
`hybridrl train` with no config file, so the run starts from verl's defaults (keys.py); the CLI runs
them (hybridrl/cli/verl.py).
"""

from __future__ import annotations

# The config names of verl's entry points that these modules stand in for.
_OWN_CONFIG = {"ppo": "ppo_trainer", "dapo": "dapo_trainer", "sft": "sft_trainer"}

# verl's SFT trainer spells keys after its own small tree; where each goes in ours. A prefix
# maps every key under it (`model.lora_rank` -> `actor_rollout_ref.model.lora_rank`).
_A, _M = "actor_rollout_ref.actor", "actor_rollout_ref.model"
SFT_KEYS: dict[str, str] = {
    "model.partial_pretrain": f"{_M}.path",
    "model.fsdp_config.cpu_offload": f"{_A}.fsdp_config.param_offload",
    "model.fsdp_config.offload_params": f"{_A}.fsdp_config.param_offload",
    "model.fsdp_config": f"{_A}.fsdp_config",
    "model.strategy": f"{_A}.strategy",
    "model": _M,
    "optim.lr_scheduler": f"{_A}.optim.lr_scheduler_type",
    "optim": f"{_A}.optim",
    "data.micro_batch_size_per_gpu": f"{_A}.ppo_micro_batch_size_per_gpu",
    "data.micro_batch_size": "sft.micro_batch_size",  # deprecated in verl's SFT trainer, which no longer reads it
    "data.multiturn": "sft.multiturn",  # rows with a `messages` column are conversations here anyway
    "data.balance_dp_token": "sft.balance_dp_token",
    "data.chat_template": f"{_M}.custom_chat_template",
    "data.prompt_dict_keys": "sft.prompt_dict_keys",
    "data.response_dict_keys": "sft.response_dict_keys",
    "ulysses_sequence_parallel_size": f"{_A}.ulysses_sequence_parallel_size",
    "use_remove_padding": f"{_M}.use_remove_padding",
    "trainer.checkpoint": f"{_A}.checkpoint",
}

# verl's sft_trainer.yaml defaults that differ from hybridrl's (in our key names).
SFT_DEFAULTS: list[str] = [
    "algorithm.name=sft",
    f"{_A}.optim.lr=1e-5",
    f"{_A}.optim.betas=[0.9,0.95]",
    f"{_A}.optim.lr_warmup_steps_ratio=0.1",
    f"{_A}.optim.lr_scheduler_type=cosine",
    "data.train_batch_size=256",
    f"{_A}.ppo_micro_batch_size_per_gpu=4",
    "data.prompt_key=question",
    "data.response_key=answer",
    "data.max_prompt_length=1024",
    "data.max_response_length=1024",
    f"{_M}.enable_gradient_checkpointing=true",
    "trainer.total_epochs=4",
    "trainer.n_gpus_per_node=8",
    "trainer.project_name=gsm8k-sft",
    "trainer.experiment_name=test",
    "trainer.logger=[console,wandb]",
]


class ArgvError(ValueError):
    """A verl command line hybridrl cannot take; the message says why and what to do."""


def split_argv(argv: list[str], entry: str) -> list[str]:
    """The Hydra overrides of a verl argv, after checking its --config-path / --config-name."""
    overrides, name = [], None
    it = iter(argv)
    for arg in it:
        if arg in ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"):
            value = next(it, None)
            if arg in ("--config-name", "-cn"):
                name = value
            continue
        if arg.startswith(("--config-path=", "--config-dir=")):
            continue
        if arg in ("--cfg", "-c") or arg.startswith("--cfg="):  # Hydra's: print the config, run nothing
            overrides.insert(0, f"--cfg={arg.split('=', 1)[1] if '=' in arg else next(it, '')}")
            continue
        if arg.startswith("--config-name="):
            name = arg.split("=", 1)[1]
            continue
        if arg.startswith("-"):
            raise ArgvError(
                f"{arg}: hybridrl's verl entry points take Hydra overrides (key=value) and --config-path/--config-name only"
            )
        if arg.split("=", 1)[0].lstrip("+~").startswith("hydra."):
            continue  # Hydra's own settings (run dir, logging): nothing to do here
        overrides.append(arg)
    if name is not None and name.removesuffix(".yaml") != _OWN_CONFIG[entry]:
        if "megatron" in name:
            raise ArgvError(
                f"--config-name={name}: the Megatron strategy is not available here (hybridrl trains "
                f"with FSDP2); drop --config-name to use verl's {_OWN_CONFIG[entry]} defaults"
            )
        raise ArgvError(
            f"--config-name={name}: hybridrl starts from verl's {_OWN_CONFIG[entry]} defaults; to use "
            f"your own YAML, run `hybridrl train {name}.yaml key=value ...` (hybridrl's key names)"
        )
    return overrides


def sft_overrides(overrides: list[str]) -> list[str]:
    """verl SFT trainer overrides in hybridrl's key names (prefixes as in SFT_KEYS)."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        lead = key[: len(key) - len(key.lstrip("+~"))]
        bare = key[len(lead) :]
        for prefix in sorted(SFT_KEYS, key=len, reverse=True):
            if bare == prefix or bare.startswith(prefix + "."):
                bare = SFT_KEYS[prefix] + bare[len(prefix) :]
                break
        if bare == "data.max_length":  # verl: prompt + response; here each part has its limit
            out += [f"data.max_prompt_length={value}", f"data.max_response_length={value}"]
            continue
        if bare in ("data.val_files", "data.val_max_samples"):
            bare = "sft." + bare[5:]  # hybridrl's SFT has no validation pass (verl's reports a validation loss)
        out.append(f"{lead}{bare}{sep}{value}")
    return out


def usage(entry: str) -> str:
    module = "sft_trainer" if entry == "sft" else f"main_{entry}"
    return f"usage: python -m hybridrl.{module} key=value ... (verl's argv; see docs/verl.md)"


def train_args(entry: str, argv: list[str]) -> list[str]:
    """The `hybridrl train` arguments of a verl argv of `entry` (ppo, dapo, sft); ArgvError if it cannot run."""
    overrides = split_argv(argv, entry)
    if entry == "sft":
        overrides = SFT_DEFAULTS + sft_overrides(overrides)
    return ["train", f"--verl={entry}", *overrides]
