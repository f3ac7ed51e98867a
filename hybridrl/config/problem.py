"""`Problem`: one thing wrong with a config, with the keys involved and a fix when one change does.

Every check (config/validate.py, config/checks/, config/batch_plan.py) reports through it.
"""

from dataclasses import dataclass
from typing import Any

from .schema import show


@dataclass
class Problem:
    """One thing wrong with a config."""

    message: str  # names the keys and suggests a value that works
    keys: tuple[str, ...]  # the keys involved, first the one to change
    fix: dict[str, Any] | None = None  # overrides that remove this problem, when one change does


def get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def suggest(key: str, value: Any, rule: str, fix: Any) -> Problem:
    return Problem(f"{key}={show(value)} {rule}; use e.g. {key}={show(fix)}", (key,), {key: fix})
