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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("staging", ["device", "host"])
def test_a_staged_push_is_read_on_another_stream_after_its_event(staging):
    """The broadcasting thread's path without NCCL: a stream of its own waits on `Staged.ready`,
    then reads each bucket (the device buffer, or an asynchronous copy from the pinned arena)."""
    from hybridrl.distributed.weight_staging import DeviceStaging, HostStaging, free_bytes

    device = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=device).manual_seed(0)
    tensors = [(f"t{i}", torch.randn(3000 + i, 7, generator=g, device=device)) for i in range(6)]
    cls = DeviceStaging if staging == "device" else HostStaging
    staged = cls(device, torch.bfloat16, bucket_numel=2**15).stage(tensors)
    assert all(b.is_cuda if staging == "device" else b.is_pinned() for b in staged.buffers)
    side = torch.cuda.Stream(device)
    side.wait_event(staged.ready)
    with torch.cuda.stream(side):
        flats = [staged.flat(i, device) for i in range(len(staged.buckets))]
    side.synchronize()
    got = {name: flat[o : o + n].view(shape) for flat, b in zip(flats, staged.buckets) for name, shape, o, n in b.entries}
    for name, t in tensors:
        assert torch.equal(got[name], t.to(torch.bfloat16)), name
    assert free_bytes(device) >= torch.cuda.mem_get_info(device)[0] > 0
