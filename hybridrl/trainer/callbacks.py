"""Callbacks for the Python API: code of the caller's that runs after each step, validation and checkpoint.

A callback is any object with some of these methods (the others are not needed):

    on_step_end(metrics: dict)     after each training step's metrics are logged (step >= 1)
    on_evaluate(metrics: dict)     after a validation (val-core/..., val-aux/...), step 0 included
    on_save(path: Path)            after a checkpoint is written (checkpoints/step_N)

A method that returns True stops the run after this step: the step's checkpoint is written and
`fit()` returns as at the last step. `EarlyStopping` is such a callback.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["EarlyStopping", "with_callbacks"]

HOOKS = ("on_step_end", "on_evaluate", "on_save")


class EarlyStopping:
    """Stop when `metric` has not improved by more than `min_delta` for `patience` checks in a row.

    A validation metric (`val-core/...`) is checked on each validation, any other metric on each step.

    >>> stop = EarlyStopping("val-core/arith/reward/mean@1", patience=2)
    >>> [stop.on_evaluate({"val-core/arith/reward/mean@1": v}) for v in (0.1, 0.3, 0.3, 0.2)]
    [False, False, False, True]
    >>> stop.best
    0.3
    """

    def __init__(self, metric: str, patience: int = 3, mode: str = "max", min_delta: float = 0.0):
        if mode not in ("max", "min"):
            raise ValueError(f"EarlyStopping mode must be 'max' or 'min', got {mode!r}")
        if patience < 1:
            raise ValueError(f"EarlyStopping patience must be >= 1, got {patience}")
        self.metric, self.patience, self.mode, self.min_delta = metric, patience, mode, min_delta
        self.best: float | None = None
        self.bad = 0
        self.validation = metric.startswith(("val-core/", "val-aux/"))

    def on_step_end(self, metrics: dict) -> bool:
        return False if self.validation else self._check(metrics)

    def on_evaluate(self, metrics: dict) -> bool:
        return self._check(metrics) if self.validation else False

    def _check(self, metrics: dict) -> bool:
        if self.metric not in metrics:
            raise KeyError(f"EarlyStopping: no metric {self.metric!r}; the step logged {sorted(metrics)[:12]} ...")
        value = float(metrics[self.metric])
        better = self.best is None or (
            value > self.best + self.min_delta if self.mode == "max" else value < self.best - self.min_delta
        )
        if better and math.isfinite(value):
            self.best, self.bad = value, 0
        else:
            self.bad += 1
        return self.bad >= self.patience


def check_callbacks(callbacks: Sequence[Any]) -> list:
    """The callbacks as a list; a ValueError when one has none of the hooks (a typo in a method name), or a
    hook that cannot be called with its one argument (checked now, not at the first step)."""
    out = list(callbacks or [])
    for cb in out:
        if not any(callable(getattr(cb, h, None)) for h in HOOKS):
            raise ValueError(f"callback {type(cb).__name__} has none of {', '.join(HOOKS)}; define at least one of them")
        for hook, arg in zip(HOOKS, ("metrics", "metrics", "path")):
            method = getattr(cb, hook, None)
            if callable(method) and not _takes_one(method):
                raise ValueError(
                    f"callback {type(cb).__name__}.{hook}{inspect.signature(method)} cannot be called as {hook}({arg}); "
                    f"hybridrl calls it with one argument"
                )
    return out


def _takes_one(method) -> bool:
    try:
        inspect.signature(method).bind(None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): let it be
        return True
    return True


class _Tracker:
    """The run's tracker, calling the callbacks after each log; a True answer ends the run after this step."""

    def __init__(self, inner, run, callbacks: list):
        self.inner, self.run, self.callbacks = inner, run, callbacks

    def log(self, metrics: dict, step: int) -> None:
        self.inner.log(metrics, step)
        stop = False
        evaluation = {k: v for k, v in metrics.items() if k.startswith(("val-core/", "val-aux/"))}
        for cb in self.callbacks:
            if step > 0 and callable(getattr(cb, "on_step_end", None)):
                stop |= bool(cb.on_step_end(dict(metrics)))
            if evaluation and callable(getattr(cb, "on_evaluate", None)):
                stop |= bool(cb.on_evaluate(dict(evaluation)))
        if stop and step > 0 and step < self.run.total_steps:
            print(f"[hybridrl] a callback stopped the run after step {step} of {self.run.total_steps}", flush=True)
            self.run.total_steps = step  # the loop ends this step as its last (trainer/loop.py), with a checkpoint

    def __getattr__(self, name):
        return getattr(self.inner, name)


def with_callbacks(make_trainer, callbacks: list):
    """`make_trainer(cfg)` whose run calls `callbacks` (see the module docstring)."""
    if not callbacks:
        return make_trainer

    def make(cfg):
        trainer = make_trainer(cfg)
        run = trainer.run
        run.tracker = _Tracker(run.tracker, run, callbacks)
        save = run.save_checkpoint

        def save_checkpoint(state) -> Path:
            path = save(state)
            for cb in callbacks:
                if callable(getattr(cb, "on_save", None)):
                    cb.on_save(Path(path))
            return path

        run.save_checkpoint = save_checkpoint
        return trainer

    return make
