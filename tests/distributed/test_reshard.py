"""Resharding FSDP2 shards into tensor-parallel rollout pieces (gloo, CPU): every rank receives
exactly `tp_shards.shard(name, full)` of every parameter — bit for bit, in float32 and bfloat16,
with a vocabulary no TP size divides, GQA with fewer KV heads than TP ranks, HSDP and LoRA —
and fewer bytes than a full gather."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
import reshard_workers as W  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "world,tp,dtype,hsdp,lora_rank",
    [
        (2, 2, "float32", False, 0),
        (2, 2, "bfloat16", False, 0),
        (4, 4, "float32", False, 0),
        (4, 2, "float32", True, 0),
        (2, 2, "float32", False, 4),
    ],
)
def test_pieces_equal_the_shard_spec(tmp_path, world, tp, dtype, hsdp, lora_rank):
    out = str(tmp_path / "r.pt")
    mp.start_processes(W.rank_main, args=(world, _port(), tp, dtype, hsdp, lora_rank, out), nprocs=world, start_method="spawn")
    for rank, r in enumerate(torch.load(out, weights_only=True)):
        assert r["names_equal"] and r["dtype_ok"], rank
        assert r["mismatch"] == [], (rank, r["mismatch"])
        # about 1/tp of the matrices (norms arrive whole): well under a full gather
        assert 0 < r["received"] < 0.75 * r["full"], (rank, r["received"], r["full"])


def test_benchmark_smoke_mode(tmp_path):
    """benchmarks/reshard.py --smoke (2 gloo processes, tiny model): a row per TP size, resharding
    receiving less than the full gather."""
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "benchmarks/reshard.py", "--smoke"]
    cmd += ["--repeats", "1", "--out", str(tmp_path)]
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (row,) = json.loads((tmp_path / "reshard.json").read_text())
    assert row["model"] == "tiny" and row["world"] == 2 and row["tp"] == 2
    assert 0 < row["reshard_gb_per_rank"] < 0.75 * row["full_gather_gb_per_rank"]
    assert row["reshard_ms"] > 0 and row["full_gather_ms"] > 0
