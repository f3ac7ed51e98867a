"""The verl entry points: argv checks, the DAPO recipe's argv, and verl's SFT trainer argv
(trains 2 CPU steps on the tiny model)."""

import json

import pytest
from corpus import scripts

from hybridrl.cli.verl import main
from hybridrl.compat.verl.argv import ArgvError, sft_overrides, split_argv
from hybridrl.config import load_config


def test_config_name_and_hydra_settings():
    assert split_argv(["--config-path", "config", "--config-name=ppo_trainer", "hydra.run.dir=x", "a.b=1"], "ppo") == ["a.b=1"]
    with pytest.raises(ArgvError, match="the Megatron strategy is not available here"):
        split_argv(["--config-name", "ppo_megatron_trainer"], "ppo")
    with pytest.raises(ArgvError, match="run `hybridrl train my_exp.yaml"):
        split_argv(["--config-name=my_exp"], "ppo")
    with pytest.raises(ArgvError, match="--foo: hybridrl's verl entry points take Hydra overrides"):
        split_argv(["--foo"], "ppo")


def test_unknown_option_is_a_one_line_error(capsys):
    assert main("ppo", ["--foo"]) == 2
    assert capsys.readouterr().err.startswith("hybridrl: error: --foo:")


def test_the_dapo_recipe_entry_uses_its_defaults():
    (dapo,) = [s for s in scripts() if s.entry == "dapo"]
    cfg = load_config(None, dapo.argv, verl="dapo")
    assert cfg.trainer.project_name == "DAPO"  # the script's own
    a = cfg.actor_rollout_ref.actor
    assert (a.clip_ratio_low, a.clip_ratio_high, a.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert (
        load_config(None, ["actor_rollout_ref.model.path=m", "data.train_files=t.parquet"], verl="dapo").trainer.project_name
        == "verl-dapo"
    )


def test_sft_argv_maps_onto_hybridrls_keys():
    assert sft_overrides(
        [
            "model.partial_pretrain=m",
            "optim.lr=1e-4",
            "data.micro_batch_size_per_gpu=4",
            "+data.response_key=answer",
            "data.max_length=64",
            "optim.lr_scheduler=cosine",
            "ulysses_sequence_parallel_size=2",
            "data.val_files=x",
        ]
    ) == [
        "actor_rollout_ref.model.path=m",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "+data.response_key=answer",
        "data.max_prompt_length=64",
        "data.max_response_length=64",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "sft.val_files=x",
    ]


@pytest.mark.slow
def test_verls_sft_argv_trains(tiny_model_with_weights, arith_data, tmp_path, capsys):
    out = tmp_path / "sft"
    argv = [
        f"data.train_files={arith_data['sft']}",
        f"data.val_files={arith_data['test']}",
        "data.prompt_key=prompt",
        "data.response_key=response",
        "optim.lr=1e-3",
        "data.micro_batch_size_per_gpu=2",
        "data.train_batch_size=4",
        "data.max_length=16",
        f"model.partial_pretrain={tiny_model_with_weights}",
        "model.enable_gradient_checkpointing=False",
        "model.strategy=fsdp2",
        "model.use_liger=False",
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={out}",
        "trainer.logger=console",
        "trainer.project_name=gsm8k-sft",
        "use_remove_padding=true",
        "trainer.checkpoint.save_contents=[model]",
    ]
    assert main("sft", argv) == 0
    err = capsys.readouterr().err
    assert "sft.val_files (hybridrl's SFT has no validation pass)" in err
    assert "actor_rollout_ref.model.use_liger" in err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["step"] >= 1] == [1, 2]
    cfg = load_config(out / "config.yaml")
    a = cfg.actor_rollout_ref.actor
    assert (cfg.algorithm.name, a.optim.lr, a.optim.lr_scheduler_type, a.optim.betas) == ("sft", 1e-3, "cosine", [0.9, 0.95])
    assert (a.optim.lr_warmup_steps_ratio, cfg.data.response_key, a.ppo_micro_batch_size_per_gpu) == (0.1, "response", 2)
