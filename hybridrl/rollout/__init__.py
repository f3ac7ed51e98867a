"""Generation engines behind one interface (`RolloutEngine`), built by `build_rollout`.

The names are loaded on first use, so that `hybridrl.rollout.factory`'s rules can be imported
without torch (the config checks call them)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Hooks": "hybridrl.rollout.base",
    "RolloutEngine": "hybridrl.rollout.base",
    "SamplingParams": "hybridrl.rollout.base",
    "build_rollout": "hybridrl.rollout.factory",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hybridrl.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = list(_EXPORTS)
