"""`hybridrl train ... rollout.name=native` end to end on CPU (tiny Qwen2 model, a few steps)."""

from __future__ import annotations

import pytest
from cli_helpers import assert_all_finite, cli, metrics

pytestmark = pytest.mark.slow


def test_grpo_with_the_native_engine(tiny_model_with_weights, arith_data, tmp_path):
    out = tmp_path / "run"
    overrides = {
        "data.train_files": arith_data["train"],
        "data.val_files": arith_data["test"],
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 6,
        "actor_rollout_ref.model.path": tiny_model_with_weights,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.optim.lr": 1e-2,
        "actor_rollout_ref.rollout.name": "native",
        "actor_rollout_ref.rollout.n": 4,
        "algorithm.adv_estimator": "grpo",
        "trainer.device": "cpu",
        "trainer.total_training_steps": 3,
        "trainer.default_local_dir": out,
        "trainer.logger": "[console,jsonl]",
        "trainer.test_freq": 3,
    }
    cfg = tmp_path / "empty.yaml"
    cfg.write_text("{}\n")
    proc = cli("train", cfg, *[f"{k}={v}" for k, v in overrides.items()])
    assert "step 3/3" in proc.stdout and "using rollout.name=hf" not in proc.stderr
    rows = metrics(out)
    assert_all_finite(rows)
    train = [r for r in rows if r["step"] > 0]
    assert len(train) == 3
    for key in ("critic/score/mean", "rollout/kv_cache_usage", "perf/rollout_tokens_per_s", "response_length/mean"):
        assert all(key in r for r in train), key
    assert all(0 < r["rollout/kv_cache_usage"] <= 1 for r in train)
    # where generation's time goes: allocating the cache, the loop, building the batch, freeing it
    for r in train:
        parts = [r[f"rollout/{k}_s"] for k in ("wake", "loop", "assemble", "sleep")]
        assert all(p >= 0 for p in parts) and r["rollout/loop_s"] > 0
        assert sum(parts) <= r["timing_s/gen"]
    # the policy changes every step; the engine must sample from the current one
    assert all("timing_s/update_weights" in r for r in train[1:])
    # float32 on CPU: the engine's log-probs are the trainer's old log-probs of the same tokens
    assert all(r["training/rollout_probs_diff_mean"] < 1e-5 for r in train)
    assert "val-core/arith/reward/mean@1" in rows[-1]
