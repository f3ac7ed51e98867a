"""How many CPU threads a worker process gives torch (`trainer.cpu_threads`).

A GPU worker's host does little tensor math of its own: it packs micro-batches, queues kernels and
reads a few scalars. torch still sizes its OpenMP pool to every core it sees, and on a large VM, or
beside other jobs, each small host op then waits for dozens of threads to wake and join. On a
64-core host the one-GPU in-process update took 1.99 s where a Ray worker (one thread) took 0.59 s,
and three jobs on one node slowed each other 2-4x (issue 49). So a GPU worker gets a small pool by
default, and a CPU run splits the cores it owns between its worker processes.

"The cores it owns" are the ones the process may run on (`sched_getaffinity`: taskset, Slurm's
binding, a container's cpuset), cut further by a cgroup CPU quota (`cpu.max`: a container limited
to 8 CPUs of a 64-core host owns 8).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

GPU_THREADS = 2  # a GPU worker's pool under cpu_threads=0 (auto); measured in BENCHMARKS.md (issue 49)
DEFAULT, AUTO = -1, 0  # trainer.cpu_threads: torch's own choice (every core), or sized here


def owned_cores(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int:
    """CPUs this process may use: its affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota(Path(cgroup_root), Path(proc_cgroup))
    return max(1, min(cores, quota) if quota else cores)


def cgroup_quota(root: Path, proc_cgroup: Path) -> int | None:
    """CPUs allowed by this process's cgroup v2 `cpu.max` ("max 100000" = no limit), rounded up."""
    try:
        rel = next(line[3:] for line in proc_cgroup.read_text().splitlines() if line.startswith("0::"))
        text = (root / rel.lstrip("/") / "cpu.max").read_text().split()
    except (OSError, StopIteration, ValueError):
        return None
    if len(text) != 2 or text[0] == "max":
        return None
    try:
        return max(1, math.ceil(int(text[0]) / int(text[1])))
    except (ValueError, ZeroDivisionError):
        return None


def threads_for(setting: int, device_type: str, processes_here: int, cores: int) -> int | None:
    """The intra-op thread count for one of `processes_here` worker processes on a host whose
    process owns `cores` CPUs; None = leave torch's default (`setting` -1)."""
    if setting == DEFAULT:
        return None
    if setting > 0:
        return setting
    if device_type != "cuda" and processes_here <= 1:
        return None  # one CPU process: torch's own choice (a pool per physical core) is the right one
    share = max(1, cores // max(processes_here, 1))
    return min(GPU_THREADS, share) if device_type == "cuda" else share


def apply(setting: int, device_type: str, processes_here: int) -> int:
    """Size this process's torch thread pool (and torch.compile's worker processes, so a first
    step's compilation does not take the cores of neighbouring jobs); the pool's size."""
    import torch

    cores = owned_cores()
    n = threads_for(setting, device_type, processes_here, cores)
    if n is None:
        return torch.get_num_threads()
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)  # processes started from here (reward pool) read it
    if "TORCHINDUCTOR_COMPILE_THREADS" not in os.environ:  # the user's setting wins
        workers = max(1, cores // max(processes_here, 1))
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = str(workers)
        inductor = sys.modules.get("torch._inductor.config")  # read at import: set it if imported already
        if inductor is not None:
            inductor.compile_threads = workers
    return n
