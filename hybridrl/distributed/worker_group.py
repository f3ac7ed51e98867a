"""What the controller holds for a role: the `WorkerGroup` handle both backends implement.

`LocalWorkerGroup` (one in-process worker) and `RayWorkerGroup` (one Ray actor per rank) expose the
worker class's registered methods (`@register(Dispatch...)`): a call dispatches its inputs to the
ranks by the method's mode and collects the outputs, so the trainer never sees ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

T_co = TypeVar("T_co", covariant=True)
W_co = TypeVar("W_co", covariant=True)


class Result(Protocol[T_co]):
    """A submitted call: `get()` waits for every rank and returns the collected output."""

    def get(self) -> T_co: ...


class WorkerGroup(Protocol[W_co]):
    """A role's workers seen from the controller; W_co is the worker class whose registered methods
    the group exposes (for readers: the calls themselves are looked up by name, so a type checker
    sees them as `Callable[..., Any]`)."""

    @property
    def world_size(self) -> int: ...

    in_process: bool
    """The methods run in the controller's process (callable arguments are called, not sent)."""

    def submit(self, name: str, *args: Any, **kwargs: Any) -> Result[Any]:
        """Start `name` on every rank without waiting (e.g. the critic beside the actor)."""
        ...

    def __getattr__(self, name: str) -> Callable[..., Any]:
        """`group.method(*args)`: submit and wait."""
        ...
