"""trainer.cpu_threads (distributed/host_threads.py): a GPU worker's small CPU pool, CPU runs' cores
split between a node's workers, the cores a process owns (affinity and cgroup quota), and what
`apply` sets."""

from __future__ import annotations

import os

import pytest
import torch

from hybridrl.distributed import host_threads as ht


@pytest.mark.parametrize(
    "setting, device, procs, cores, want",
    [
        (-1, "cuda", 1, 64, None),  # torch's default
        (-1, "cpu", 4, 64, None),
        (0, "cuda", 1, 64, ht.GPU_THREADS),  # auto: a small pool for a GPU worker, whatever the host
        (0, "cuda", 8, 64, ht.GPU_THREADS),
        (0, "cuda", 4, 4, 1),  # fewer cores than GPU_THREADS per worker
        (0, "cpu", 1, 64, None),  # one CPU process: torch's own choice
        (0, "cpu", 4, 16, 4),  # CPU workers split the cores
        (0, "cpu", 4, 2, 1),
        (7, "cuda", 1, 64, 7),  # an explicit count wins
        (3, "cpu", 8, 2, 3),
    ],
)
def test_threads_for(setting, device, procs, cores, want):
    assert ht.threads_for(setting, device, procs, cores) == want


def _cgroup(tmp_path, cpu_max: str | None):
    (tmp_path / "proc").write_text("0::/user.slice/job-7\n")
    where = tmp_path / "root" / "user.slice" / "job-7"
    where.mkdir(parents=True)
    if cpu_max is not None:
        (where / "cpu.max").write_text(cpu_max + "\n")
    return str(tmp_path / "root"), str(tmp_path / "proc")


@pytest.mark.parametrize(
    "cpu_max, want",
    [("max 100000", None), ("250000 100000", 3), ("100000 100000", 1), ("50000 100000", 1), (None, None), ("junk", None)],
)
def test_a_cgroup_quota_caps_the_cores(tmp_path, cpu_max, want):
    root, proc = _cgroup(tmp_path, cpu_max)
    from pathlib import Path

    assert ht.cgroup_quota(Path(root), Path(proc)) == want
    affinity = len(os.sched_getaffinity(0))
    assert ht.owned_cores(root, proc) == (min(affinity, want) if want else affinity)


def test_owned_cores_follows_the_affinity_mask():
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert ht.owned_cores("/nonexistent", "/nonexistent") == 1
    finally:
        os.sched_setaffinity(0, before)


def test_apply_sizes_torch_and_the_compile_workers(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "99")
    try:
        assert ht.apply(1, "cuda", processes_here=1) == 1
        assert torch.get_num_threads() == 1
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == str(ht.owned_cores())
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "5")  # the user's setting wins
        ht.apply(2, "cuda", processes_here=1)
        assert os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "5"
        torch.set_num_threads(1)
        assert ht.apply(-1, "cuda", processes_here=1) == 1  # -1 leaves the pool as it is
    finally:
        torch.set_num_threads(before)
