"""The in-process backend: one worker on one device, called directly.

With a data-parallel size of one, every dispatch mode reduces to calling the method, so this
group only checks that the method was registered, the same contract the Ray group keeps.
`submit` has the Ray group's non-blocking signature; here it runs at once.
"""

from __future__ import annotations

from hybridrl.distributed.dispatch import Dispatch, dispatch_mode


class Done:
    """A finished call, with the `.get()` of a pending Ray call."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class LocalWorkerGroup:
    world_size = 1
    in_process = True  # methods run in the caller's process: a callable argument is called, not sent

    def __init__(self, worker, role: str = "worker"):
        self.worker, self.role = worker, role

    def __getattr__(self, name):
        fn = getattr(self.worker, name)
        mode = dispatch_mode(fn)
        if mode is None:
            raise AttributeError(
                f"{type(self.worker).__name__}.{name} is not a registered worker method (@register(Dispatch...))"
            )
        if mode is Dispatch.ALL:  # one rank: a list of one output, as from the Ray group
            return lambda *a, **kw: [fn(*a, **kw)]
        return fn

    def submit(self, name: str, *args, **kwargs) -> Done:
        return Done(getattr(self, name)(*args, **kwargs))

    def shutdown(self) -> None:
        return None
