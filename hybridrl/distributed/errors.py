"""The errors the runtime raises to the controller; below both backends, which raise them."""

from __future__ import annotations


class BackendError(RuntimeError):
    """The cluster cannot run the config (no Ray installed, too few devices); says what to do."""


class WorkerDiedError(RuntimeError):
    """A worker process died (killed, out of memory, segfault, node lost); names where."""

    def __init__(self, message: str, role: str, rank: int, node: str):
        super().__init__(message)
        self.role, self.rank, self.node = role, rank, node
