"""User extensions (config key `extensions`) and the names they may register.

Advantage estimators and policy losses live in registries in hybridrl.algorithms; a user adds one
by calling `register_adv_estimator` / `register_policy_loss` in a file listed in `extensions`.
The config layer imports nothing from the layers above it, so it does not read those registries
itself: whoever composes the package hands it a function per key that returns the names
(`use_registry`; hybridrl/__init__.py does it once for the whole package), and the few rules of
those layers that the checks apply (`use_rule`). Validation, `explain`
and docs/config.md all take the allowed values from there, so a name registered by an extension
is as selectable as a built-in one.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable

_NAME_SOURCES: dict[str, Callable[[], Iterable[str]]] = {}


def use_registry(key: str, names: Callable[[], Iterable[str]]) -> None:
    """Take the allowed values of config `key` from `names()`, asked each time a config is checked."""
    _NAME_SOURCES[key] = names


def registered_choices() -> dict[str, tuple[str, ...]]:
    """{config key: the names registered for it now}, for every key wired with `use_registry`."""
    return {key: tuple(names()) for key, names in _NAME_SOURCES.items()}


# Rules a feature above this layer keeps once, beside itself, and the checks apply as the feature
# does: the forced-length schedule (rollout/lengths.py), the TP shard spec (models/tp_shards.py), the
# agent's tool and interaction files (rollout/agent/). Handed in like the registries, as
# "module:function" paths imported on first use (hybridrl/__init__.py), so this layer imports nothing above it.
_RULES: dict[str, str] = {}


def use_rule(name: str, where: str) -> None:
    """Let the config checks apply the function at `where` ("package.module:function") as `name`."""
    _RULES[name] = where


def feature_rule(name: str) -> Callable:
    """The function handed in as `name`, imported now."""
    if name not in _RULES:
        raise RuntimeError(f"config rule {name!r} was not handed in (hybridrl/__init__.py wires the rules on import)")
    module, function = _RULES[name].split(":")
    return getattr(importlib.import_module(module), function)


def load_extensions(entries: Iterable[str]) -> None:
    """Import every entry of `extensions`: a path ending in .py, or an importable module name.

    Idempotent: a file is registered in sys.modules under a name derived from its absolute path,
    and a module imported twice is not executed twice. Raises ValueError with a one-line reason.
    """
    for entry in entries:
        entry = str(entry)
        if entry.endswith(".py"):
            _import_file(entry)
            continue
        try:
            importlib.import_module(entry)
        except ImportError as e:
            raise ValueError(
                f"extensions: cannot import module {entry!r} ({e}); give a module name on sys.path or a .py file"
            ) from None


def _import_file(path: str) -> None:
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise ValueError(f"extensions: file not found: {path!r} (resolved to {full})")
    name = "hybridrl_extension_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, full)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ValueError(f"extensions: importing {full} failed: {type(e).__name__}: {e}") from None
