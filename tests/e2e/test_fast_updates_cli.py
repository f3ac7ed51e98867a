"""The CLI with the fast-update options: LoRA, token-budget micro-batches, packed passes."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import assert_all_finite, cli, metrics
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow


def test_lora_dynamic_bsz_run_logs_perf_metrics_and_saves_a_loadable_policy(tiny_model_dir, arith_data, tmp_path):
    out = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algorithm:\n  adv_estimator: grpo\n")
    overrides = {
        "data.train_files": arith_data["train"],
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 4,
        "actor_rollout_ref.model.path": tiny_model_dir,
        "actor_rollout_ref.model.random_init": "true",
        "actor_rollout_ref.model.lora_rank": 4,
        "actor_rollout_ref.actor.use_kl_loss": "true",
        # the random model scores 0 on every sample (zero advantages): the entropy bonus is what moves the adapters
        "actor_rollout_ref.actor.entropy_coeff": 0.01,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.use_dynamic_bsz": "true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 24,
        "actor_rollout_ref.actor.optim.lr": 1e-2,
        "actor_rollout_ref.rollout.n": 2,
        "trainer.device": "cpu",
        "trainer.total_training_steps": 2,
        "trainer.default_local_dir": out,
        "trainer.logger": "[console,jsonl]",
    }
    cli("train", cfg, *[f"{k}={v}" for k, v in overrides.items()])
    rows = [r for r in metrics(out) if r["step"] > 0]
    assert len(rows) == 2
    assert_all_finite(rows)
    for r in rows:
        assert r["actor/pad_fraction"] == 0.0  # packed: no padding computed
        # The HF engine samples from the current (peft) policy: its log-probs match the trainer's.
        assert r["training/rollout_probs_diff_mean"] < 1e-5 and r["training/rollout_probs_diff_max"] < 1e-4, r
        assert "perf/mfu/actor" not in r  # no peak FLOP/s for a CPU
    step = out / "checkpoints" / "step_2"
    assert (step / "actor" / "adapter" / "adapter_model.safetensors").exists()
    assert (step / "lora_base").is_dir()  # the random-init base, for exact resume
    merged = AutoModelForCausalLM.from_pretrained(step / "actor")
    base = AutoModelForCausalLM.from_pretrained(step / "lora_base")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[q], base.state_dict()[q])  # the adapters are folded in
    # `hybridrl eval` takes the run directory (its latest LoRA checkpoint's merged actor/) as it is;
    # `hybridrl export` says that actor/ is already an HF directory.
    ev = cli("eval", "--model", out, "--data", arith_data["test"], "--max-response-length", 4, "--limit", 4)
    assert "accuracy" in ev.stdout
    exp = cli("export", out, tmp_path / "hf", check=False)
    assert exp.returncode == 2 and "already a plain HF model directory" in exp.stderr and str(step / "actor") in exp.stderr
