"""Several GPUs (NCCL, FSDP2 with bf16 compute): skipped without 2 CUDA devices and Ray.

The CPU tests (tests/distributed) prove the numbers; this proves the NCCL/CUDA paths run:
colocated and split placement train, a 2-GPU checkpoint resumes on 1 GPU, and it exports.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from cli_helpers import assert_all_finite, cli, metrics

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"),
]


def _train(out, data, *overrides):
    return cli(
        "train",
        ROOT / "configs/quickstart.yaml",
        "trainer.device=cuda",
        f"trainer.default_local_dir={out}",
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"warmup.files={data['sft']}",
        "warmup.steps=4",
        "trainer.test_freq=-1",
        "trainer.logger=[console,jsonl]",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        *overrides,
    )


def test_two_gpus_colocated_then_one_gpu_resume_and_export(arith_data, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "run"
    first = _train(out, arith_data, "trainer.n_gpus_per_node=2", "trainer.total_training_steps=3", "trainer.save_freq=2")
    assert "Ray, device cuda (colocated: 2 ranks)" in first.stdout
    second = _train(out, arith_data, "trainer.n_gpus_per_node=1", "trainer.total_training_steps=4", "trainer.resume_mode=auto")
    assert "resumed from" in second.stdout and "step 3/4" in second.stdout
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert_all_finite(rows)
    cli("export", out, tmp_path / "hf")
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").num_parameters() > 0


def test_two_gpus_split_placement_ppo(arith_data, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "run"
    _train(
        out,
        arith_data,
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "algorithm.adv_estimator=gae",
        "resource_pool.actor_rollout_ref=1",
        "resource_pool.critic=1",
    )
    rows = metrics(out)
    assert_all_finite(rows)
    assert all("critic/vf_loss" in r for r in rows[1:])


def test_two_gpus_native_engine_follows_the_sharded_policy(arith_data, tmp_path):
    """The native engine on every rank, fed full weights gathered from the FSDP2 shards."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    first = _train(
        out, arith_data, "trainer.n_gpus_per_node=2", "trainer.total_training_steps=3", "actor_rollout_ref.rollout.name=native"
    )
    assert "Ray, device cuda (colocated: 2 ranks)" in first.stdout
    rows = metrics(out)
    assert_all_finite(rows)
    # the engine samples from the weights being trained: its log-probs match the actor's
    assert all(r["training/rollout_probs_diff_mean"] < 0.02 for r in rows[1:])
