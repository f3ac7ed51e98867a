"""The in-process backend: one worker on one device, called directly.

With a data-parallel size of one, every dispatch mode reduces to calling the method, so this
group only checks that the method was registered — the same contract the Ray group keeps.
"""

from __future__ import annotations

from hybridrl.distributed.dispatch import dispatch_mode


class LocalWorkerGroup:
    world_size = 1

    def __init__(self, worker):
        self.worker = worker

    def __getattr__(self, name):
        fn = getattr(self.worker, name)
        if dispatch_mode(fn) is None:
            raise AttributeError(
                f"{type(self.worker).__name__}.{name} is not a registered worker method (@register(Dispatch...))"
            )
        return fn
