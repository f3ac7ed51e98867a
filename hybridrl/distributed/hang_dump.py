"""`HYBRIDRL_DUMP_STACKS_S=N`: every process of a run (the driver and each Ray worker, which get the
driver's HYBRIDRL_* variables) writes every thread's Python stack to its stderr every N seconds.

For a run that hangs: a collective that one rank never joins, a loop that never ends. Ray passes a
worker's stderr on to the driver's output, prefixed with the worker's pid, so one log shows where
each rank waits. Off unless set; costs nothing while the process is busy elsewhere (Python's
faulthandler, a C-level watchdog thread).
"""

from __future__ import annotations

import faulthandler
import os
import sys

VAR = "HYBRIDRL_DUMP_STACKS_S"


def dump_stacks_if_asked() -> float | None:
    """Start the periodic dump when the variable is set; its period in seconds (None: unset)."""
    raw = os.environ.get(VAR, "").strip()
    if not raw:
        return None
    try:
        period = float(raw)
    except ValueError:
        period = float("nan")
    if not period > 0 or period == float("inf"):
        raise ValueError(f"{VAR}={raw!r}: a period in seconds > 0, e.g. {VAR}=120")
    faulthandler.dump_traceback_later(period, repeat=True, file=sys.stderr)
    return period
