"""Progress bars on a terminal only (tqdm): evaluation batches, a long rollout, model loading and export.

In a log file, under CI or in a notebook's captured output the bars would be thousands of lines of
carriage returns, so they appear only when stderr is a terminal (HYBRIDRL_PROGRESS=0 turns them off
there too; =1 forces every bar). A bar that finishes within `delay` seconds is never drawn, and bars are
erased when done (`leave=False`), so the one line per training step stays as it was.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading


def on_terminal() -> bool:
    forced = os.environ.get("HYBRIDRL_PROGRESS", "")
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty()


class _Nothing:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def bar(total: int | None, desc: str, unit: str = "it", delay: float = 1.0, **kwargs):
    """A tqdm bar on stderr when it is a terminal, else an object whose update/close do nothing."""
    if not on_terminal():
        return _Nothing()
    from tqdm import tqdm

    if os.environ.get("HYBRIDRL_PROGRESS") == "1":
        delay = 0.0  # forced: every bar, however short

    return tqdm(total=total, desc=desc, unit=unit, leave=False, delay=delay, dynamic_ncols=True, file=sys.stderr, **kwargs)


@contextlib.contextmanager
def ticker(desc: str, delay: float = 2.0, every: float = 0.5):
    """Around one long call that reports nothing while it runs (a rollout): after `delay` seconds, a
    line with the elapsed time, refreshed every `every` seconds, erased when the call returns."""
    if not on_terminal():
        yield
        return
    b = bar(None, desc, delay=delay, bar_format="{desc}: {elapsed}")
    done = threading.Event()

    def tick() -> None:
        while not done.wait(every):
            b.refresh()

    t = threading.Thread(target=tick, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        b.close()


def library_bars(show: bool) -> None:
    """transformers' and huggingface_hub's own bars (loading weights, writing shards, downloads): on a
    terminal only."""
    from transformers.utils import logging as hf_logging

    if show:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

        (enable_progress_bars if show else disable_progress_bars)()
