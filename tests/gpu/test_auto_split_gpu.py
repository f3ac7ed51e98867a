"""resource_pool.rollout=auto on 2 GPUs (NCCL weight channel, native engine): skipped without 2 CUDA devices and Ray.

tests/distributed/test_auto_split.py proves the steps on gloo; this proves the re-forming runs on
GPUs: the calibration's Ray workers give their GPUs back and the split's pool and actor take them.
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
        "trainer.n_gpus_per_node=2",
        f"trainer.default_local_dir={out}",
        f"data.train_files={data['train']}",
        "data.val_files=null",
        f"warmup.files={data['sft']}",
        "warmup.steps=4",
        "trainer.logger=[console,jsonl]",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.name=native",
        "trainer.mode=one_step_off",
        "resource_pool.rollout=auto",
        *overrides,
    )


def test_two_gpus_auto_split_reforms_on_nccl(arith_data, tmp_path):
    """rollout_auto_min_gain=-1: the only split, 1 + 1, whatever the times; steps 1-2 calibrate, 3-6 on the split."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    run = _train(out, arith_data, "trainer.total_training_steps=6", "resource_pool.rollout_auto_min_gain=-1")
    assert "resource_pool.rollout=auto after 2 step(s): 1 trainer + 1 rollout devices" in run.stdout
    assert "re-forming the worker groups, 1 + 1" in run.stdout and "resumed from" in run.stdout
    rows = {r["step"]: r for r in metrics(out)}
    assert sorted(rows) == [0, 1, 2, 3, 4, 5, 6]
    assert_all_finite(list(rows.values()))
    assert rows[2]["resource_pool/rollout_auto"] == 1.0 and rows[2]["timing_s/gen"] > 0
    assert all("rollout_pool/weights_version" in rows[s] for s in (3, 4, 5, 6))
    assert [rows[s]["async/staleness_max"] for s in (3, 4, 5, 6)] == [0.0, 1.0, 1.0, 1.0]
    assert rows[6]["resource_pool/rollout_auto_speedup"] > 0


def test_two_gpus_auto_split_decides_from_the_times(arith_data, tmp_path):
    """The default min_gain: the decision is the model's on the measured times, and the run finishes either way."""
    pytest.importorskip("ray")
    out = tmp_path / "run"
    run = _train(out, arith_data, "trainer.total_training_steps=4")
    assert "resource_pool.rollout=auto after 2 step(s): " in run.stdout
    rows = {r["step"]: r for r in metrics(out)}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[2]["resource_pool/rollout_auto"] in (0.0, 1.0)
    assert rows[2]["resource_pool/rollout_auto_predicted_step_s"] > 0
