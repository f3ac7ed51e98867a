"""transformers' `TrainerCallback` (TRL's callbacks are ones) passed to hybridrl: refused at the start, in one line.

Its hooks are `on_step_end(args, state, control, **kwargs)` and the like; hybridrl calls `on_step_end(metrics)`,
`on_evaluate(metrics)` and `on_save(path)` (hybridrl/trainer/callbacks.py). Without this check such a
callback would pass for one of hybridrl's (it has the method names) and fail with a TypeError at the first step.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

# transformers' hook parameters, in its order.
_TRAINER_PARAMS = ("args", "state", "control")


def check_callbacks(callbacks: Sequence[Any] | None) -> list:
    """The callbacks as a list; a ValueError naming the first transformers-shaped one."""
    out = list(callbacks or [])
    for cb in out:
        hook = _trainer_hook(cb)
        if hook is not None:
            name = cb.__name__ if isinstance(cb, type) else type(cb).__name__
            raise ValueError(
                f"callback {name} is a transformers TrainerCallback ({hook}(args, state, control, **kwargs)); hybridrl "
                f"calls on_step_end(metrics), on_evaluate(metrics) and on_save(path): write a class with those "
                f"(hybridrl.EarlyStopping stands for EarlyStoppingCallback; docs/coming_from_trl.md)"
            )
    return out


def _trainer_hook(cb: Any) -> str | None:
    """The name of a hook of `cb` with transformers' signature, or None."""
    if any(c.__name__ == "TrainerCallback" for c in inspect.getmro(cb if isinstance(cb, type) else type(cb))):
        return next((h for h in ("on_step_end", "on_evaluate", "on_save") if hasattr(cb, h)), "on_step_end")
    for name in ("on_step_end", "on_evaluate", "on_save", "on_log", "on_train_begin", "on_train_end"):
        method = getattr(cb, name, None)
        if not callable(method):
            continue
        try:
            params = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            continue
        if params[: len(_TRAINER_PARAMS)] == list(_TRAINER_PARAMS) or params[1:4] == list(_TRAINER_PARAMS):
            return name
    return None
