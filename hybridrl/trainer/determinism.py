"""trainer.deterministic: the same seed gives the same metrics on one GPU (sync mode).

Sampling is already a pure function of per-sequence seeds in the native engine
(rollout/native/sampling.py: a counter-based hash, no generator state) and of torch's seeded
global generator in the hf engine; the order of the steps and the data are the controller's. What
varies between two GPU runs is the order of floating-point reductions inside some kernels:
cuBLAS picks split-K and stream-K schedules per workspace, cuDNN autotunes, and scatter/index_add
backward passes (the embedding's gradient) use atomics. This switches each to its deterministic
variant (PyTorch's "Reproducibility" notes); hybridrl's own Triton kernels use no atomics or
split reductions, so they need nothing. The cost is measured by benchmarks/determinism.py
(docs/reliability.md).
"""

from __future__ import annotations

import os

import torch


def make_deterministic() -> None:
    """Deterministic kernels in this process; call before the first cuBLAS call (the model's loading)."""
    # cuBLAS reads this when it creates a handle: a fixed workspace makes its reductions reproducible.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: an op with no deterministic variant warns (naming itself) instead of stopping the run;
    # benchmarks/determinism.py checks that the metrics of two runs are then still identical.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def make_worker_deterministic(pool: str, rank: int) -> None:
    """`make_deterministic` in a Ray worker process (WorkerBackend.run_on_hosts)."""
    make_deterministic()
