"""Three of the corpus's verl command lines train for 2 steps on CPU through `python -m
hybridrl.main_ppo`'s entry (in-process), with the tiny model and the arithmetic task swapped in."""

import json
from pathlib import Path

import pytest
import torch
from corpus import scripts, tiny_overrides
from safetensors.torch import load_file

from hybridrl.cli.verl import main

pytestmark = pytest.mark.slow
BY_NAME = {s.name: s for s in scripts()}


@pytest.mark.parametrize(
    "name, keys, ignores",
    [
        ("docs__start__quickstart", ["critic/vf_loss", "critic/values/mean", "actor/pg_loss", "critic/score/mean"], 0),
        ("tuning__0.5b__qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm", ["actor/pg_loss", "actor/kl_loss", "actor/entropy"], 1),
        ("remax_trainer__run_qwen2.5-3b_seq_balance", ["actor/pg_loss", "critic/advantages/mean", "response_length/mean"], 0),
    ],
)
def test_a_verl_script_trains_two_steps(name, keys, ignores, tiny_model_with_weights, arith_data, tmp_path, capsys):
    out = tmp_path / "run"
    argv = tiny_overrides(BY_NAME[name], tiny_model_with_weights, arith_data, out) + ["trainer.log_val_generations=3"]
    assert main("ppo", argv) == 0
    err = capsys.readouterr().err
    assert "hybridrl: notice: actor_rollout_ref.rollout.name=vllm: hybridrl's own engine generates" in err
    assert err.count("ignored, no effect here") == ignores  # the engine knobs, all in one notice
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in train] == [1, 2]
    for key in keys:
        assert all(key in r for r in train), key
    assert "val-core/arith/reward/mean@1" in rows[-1]
    # verl's log_val_generations: that many validation prompts kept in samples.jsonl at each validation
    val = [g for g in map(json.loads, (out / "samples.jsonl").read_text().splitlines()) if g["kind"] == "val"]
    assert [v["step"] for v in val] == [2, 2, 2] and all(len(v["responses"]) == len(v["scores"]) == 1 for v in val)
    ckpt = out / "checkpoints" / "step_2" / "actor"
    assert ckpt.is_dir()
    if "lora" not in name:
        from hybridrl.distributed.checkpoint import export_hf

        after = load_file(str(export_hf(ckpt, tmp_path / "hf") / "model.safetensors"))
        before = load_file(str(Path(tiny_model_with_weights) / "model.safetensors"))
        assert any(not torch.equal(before[k], after[k].to(before[k].dtype)) for k in before)
