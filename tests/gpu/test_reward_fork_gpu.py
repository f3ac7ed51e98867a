"""A reward function given in Python runs in forks of the trainer (hybridrl/rewards/pool.py, kind
"fork"); on a GPU machine the trainer holds a CUDA context and reserves tens of GB of address space
by the time a hung worker is replaced. The replacement must still start and score, its memory limit
must count from what it inherited (not refuse every allocation), and a worker must die with a
trainer killed mid-call. Skipped without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from hybridrl.rewards.pool import WorkerPool

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the child imports hybridrl from it

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _reward(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(600)
    block = bytearray(256 * 2**20)  # within the 1 GB limit on top of what the fork inherited
    return float(solution_str == ground_truth) + 0 * len(block)


def _item(text):
    return dict(data_source="x", solution_str=text, ground_truth="4", extra_info=None)


def test_workers_forked_after_cuda_start_score_within_their_memory_limit():
    x = torch.randn(4096, 4096, device="cuda")  # the trainer's CUDA context and memory
    torch.cuda.synchronize()
    with WorkerPool(_reward, kind="fork", num_workers=1, timeout_s=5, memory_limit_mb=1024) as pool:
        out = pool.map([_item("hang"), _item("4"), _item("5")])  # the hang replaces the worker: a fork after CUDA
    assert out[0].timed_out and [o.value for o in out[1:]] == [1.0, 0.0], [o.error for o in out]
    assert pool.replaced == 1
    del x


def test_a_worker_dies_with_a_killed_trainer_that_holds_cuda(tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(
            """
            import time, torch
            from hybridrl.rewards.pool import WorkerPool
            x = torch.randn(1024, 1024, device="cuda")
            pool = WorkerPool(lambda **kw: time.sleep(600), kind="fork", num_workers=1, timeout_s=600)
            print(pool.workers[0].proc.pid, flush=True)
            pool.map([{}])
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        pid = int(proc.stdout.readline())
    finally:
        time.sleep(1.0)
        proc.kill()
        proc.wait()
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the forked reward worker {pid} outlived the killed trainer")
