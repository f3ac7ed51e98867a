"""`HYBRIDRL_DUMP_STACKS_S=N`: every process of a run (the driver and each Ray worker, which get the
driver's HYBRIDRL_* variables) writes every thread's Python stack to its stderr every N seconds.

For a run that hangs: a collective that one rank never joins, a loop that never ends. Ray passes a
worker's stderr on to the driver's output, prefixed with the worker's pid, so one log shows where
each rank waits. Off unless set.

A daemon thread reads the stacks with `sys._current_frames()`, holding the GIL, which a thread that
waits in a collective, a `ray.get` or a sleep has released. Python's faulthandler watchdog
(`dump_traceback_later`) walks the threads without the GIL instead, and a thread that ends during
its dump can crash the process (CPython issue 116008): one test run here died of SIGSEGV that way
on 2026-11-29.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

VAR = "HYBRIDRL_DUMP_STACKS_S"
HEADER = "[hybridrl] stacks of every thread"


def format_stacks(exclude: int | None = None) -> str:
    """Every thread's Python stack, most recent call last, named as `threading` names them."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident == exclude:
            continue
        parts.append(f"Thread {ident:#x} ({names.get(ident, 'not started by threading')}):\n")
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


def _dump_every(period: float, stream) -> None:
    start, me = time.monotonic(), threading.get_ident()
    while True:
        time.sleep(period)
        text = f"{HEADER}, {time.monotonic() - start:.1f} s in ({VAR}={period:g}):\n{format_stacks(exclude=me)}"
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # stderr closed: nothing left to write to
            return


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
    threading.Thread(target=_dump_every, args=(period, sys.stderr), name="hybridrl-dump-stacks", daemon=True).start()
    return period
