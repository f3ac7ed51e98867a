"""How a worker method's input is spread over a group's ranks and its outputs gathered.

A worker class marks its public methods with `@register(Dispatch.DP)` etc.; a worker group
(the in-process one here, the Ray one for several devices) reads the mark and does the
splitting, so the controller calls `group.method(batch)` and never sees ranks.
"""

from __future__ import annotations

import enum
from typing import Callable

DISPATCH_ATTR = "_hybridrl_dispatch"


class Dispatch(enum.Enum):
    ALL = "all"  # every rank gets the same input; all outputs are returned
    DP = "dp"  # the Batch is split over data-parallel ranks; outputs concatenated in order
    RANK0 = "rank0"  # every rank runs it (SPMD), only rank 0's output is kept


def register(mode: Dispatch) -> Callable:
    def mark(fn):
        setattr(fn, DISPATCH_ATTR, mode)
        return fn

    return mark


def dispatch_mode(fn) -> Dispatch | None:
    return getattr(fn, DISPATCH_ATTR, None)
