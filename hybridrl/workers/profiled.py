"""The worker side of `trainer.profile_steps` (the profiler itself: hybridrl/tracking/profiler.py)."""

from __future__ import annotations

from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.tracking.profiler import start, stop


class ProfiledWorker:
    """Worker methods that start and stop this process's profiler (mixed into every worker)."""

    profile_role = "worker"

    @register(Dispatch.ALL)
    def start_profile(self, out_dir: str) -> bool:
        return start(out_dir, self.device, self.profile_role)

    @register(Dispatch.ALL)
    def stop_profile(self) -> str | None:
        return stop()
