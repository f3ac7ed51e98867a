"""The quickstart's GRPO on 4 CPU worker processes (Ray + gloo) laid out in 3D: training as 2
data-parallel groups x Ulysses sequence parallelism 2, rollout as 2 replicas x tensor parallelism 2
on the same ranks. A few steps: the layout runs from the CLI, every metric is finite, and the
engine's log-probs are the trainer's. That SP2 training with a TP2 rollout learns is
tests/e2e/test_tp_rollout_cli.py (2 ranks, 40 steps); on 2 CPU cores 4 ranks are ~4x slower a step."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import assert_all_finite, cli, metrics

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LAYOUT = [
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.rollout.name=native",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
]


def test_grpo_in_the_3d_layout_runs_and_the_engine_matches_the_trainer(arith_data, tmp_path):
    explained = cli("explain", ROOT / "configs/quickstart.yaml", *LAYOUT).stdout
    assert "sp 2" in explained and "dp 2" in explained and "rollout 2 replica(s) x tp 2" in explained, explained
    out = tmp_path / "run"
    cli(
        "train",
        ROOT / "configs/quickstart.yaml",
        *LAYOUT,
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=4",
        "trainer.test_freq=4",
        "trainer.save_freq=-1",
        "trainer.logger=[jsonl]",
        "warmup.steps=20",  # the layout is under test here, not the warm-up
        cwd=ROOT,  # the shipped config's data and model paths
    )
    rows = metrics(out)
    assert_all_finite(rows)
    train = [r for r in rows if "critic/score/mean" in r]
    assert len(train) == 4
    # the sp trainer's recomputed log-probs of the sampled tokens equal the tp engine's
    assert max(r["training/rollout_probs_diff_max"] for r in train) < 1e-4
    resharded = [r for r in train if "reshard/bytes_per_rank" in r]
    assert len(resharded) >= 3 and all(
        0 < r["reshard/bytes_per_rank"] < r["reshard/full_gather_bytes_per_rank"] for r in resharded
    )
    assert any("val-core/arith/reward/mean@1" in r for r in rows)
