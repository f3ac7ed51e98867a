"""`hybridrl train` GRPO on a tiny Qwen3-MoE on CPU with router replay R3: the native engine
records every token's experts, the old-log-prob and update passes replay them; the MoE metrics
are logged; the checkpoint exports as an HF directory in the per-expert layout of real
Qwen3-MoE checkpoints."""

from __future__ import annotations

import pytest
from cli_helpers import assert_all_finite, cli, metrics

from hybridrl.models.tiny import write_tiny_model_dir

pytestmark = pytest.mark.slow


def test_grpo_on_a_mixture_of_experts_with_router_replay(arith_data, tmp_path):
    model = write_tiny_model_dir(tmp_path / "tiny-moe", family="qwen3_moe")
    out = tmp_path / "run"
    overrides = {
        "data.train_files": arith_data["train"],
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 6,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.random_init": "true",
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.actor.router_replay.mode": "R3",  # rollout.name=auto: the native engine, which records
        "actor_rollout_ref.rollout.n": 4,
        "algorithm.adv_estimator": "grpo",
        "trainer.device": "cpu",
        "trainer.total_training_steps": 2,
        "trainer.default_local_dir": out,
        "trainer.logger": "[console,jsonl]",
    }
    cfg = tmp_path / "empty.yaml"
    cfg.write_text("{}\n")
    proc = cli("train", cfg, *[f"{k}={v}" for k, v in overrides.items()])
    assert "step 2/2" in proc.stdout and "using rollout.name=hf" not in proc.stderr
    rows = [r for r in metrics(out) if r["step"] > 0]
    assert len(rows) == 2
    assert_all_finite(rows)
    for r in rows:
        assert 1.0 <= r["moe/expert_load_max_over_mean"] <= 8.0 and r["moe/aux_loss"] > 0
        assert {"moe/expert_load_max_over_mean/layer_0", "moe/overflow_frac", "moe/replay_mismatch_frac"} <= set(r)
        # float32 on CPU, the engine's routing replayed: its log-probs are the trainer's
        assert r["training/rollout_probs_diff_max"] < 1e-5
    export = tmp_path / "hf"
    cli("export", out / "checkpoints" / "step_2", export)
    from safetensors import safe_open

    with safe_open(str(export / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.1.mlp.experts.7.up_proj.weight" in names and not any("gate_up_proj" in n for n in names)
