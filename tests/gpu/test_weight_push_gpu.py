"""The weight push on GPUs: the checksum is the same number on a GPU as on the CPU, and
benchmarks/weight_push.py pushes the Qwen2.5-0.5B shapes from an FSDP2 trainer on GPU 0 to a
rollout rank on GPU 1 over NCCL, staged on the host and then on the device, every verified push
checking out. Skipped without CUDA devices.

The CPU tests (tests/distributed/test_weight_checksum.py, test_verified_push.py,
test_weight_push_bench.py) prove the logic; this proves the CUDA/NCCL paths run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridrl.distributed.weight_checksum import BLOCK, checksum, reference_checksum

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_checksum_is_the_same_on_the_gpu():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        t = (torch.randn(3 * BLOCK + 5, 3, generator=g) * 10).to(dtype)
        assert checksum(t.cuda()).tolist() == checksum(t).tolist() == reference_checksum(t)
    big = torch.randn(2**25 + 7, generator=g).to(torch.bfloat16)  # several chunks
    assert checksum(big.cuda()).tolist() == checksum(big).tolist()


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_weight_push_benchmark_on_two_gpus(tmp_path):
    args = ["--trainer-ranks", "1", "--rollout-ranks", "1", "--models", "Qwen2.5-0.5B", "--pushes", "2", "--warmup", "1"]
    proc = subprocess.run(
        [sys.executable, "benchmarks/weight_push.py", *args, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "weight_push.json").read_text())["rows"]
    assert [row["staging"] for row in rows] == ["host", "device"]  # both stagings, through CUDA events and NCCL
    for row in rows:
        # Qwen2.5-0.5B: 494,032,768 parameters (tied embeddings), bf16 on the wire
        assert row["bytes"] == 2 * 494_032_768
        assert row["verified"]["checked"] == 2 and row["plain"]["checked"] == 0  # every verified push checked out
        for kind in ("plain", "verified"):
            t = row[kind]
            assert 0 < t["blocked_ms"] <= t["push_ms"] < 60_000, t
