"""Per-stage wall-clock timers reported as `timing_s/<stage>`."""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class StageTimer:
    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        # GPU work is asynchronous: synchronize so a stage is charged for its own kernels.
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.times[stage] = self.times.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.times.items()}
