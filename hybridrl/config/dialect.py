"""Another framework's config vocabulary, read through one hook: the dialect.

hybridrl's keys follow verl's names, and verl's files and command lines carry more than those keys:
Hydra `defaults:` lists and `${...}` interpolations, keys hybridrl spells differently, knobs of
engines it does not use. Their translation is the compatibility wing's (hybridrl/compat/verl). The
config layer imports nothing above it, so whoever composes the package installs the wing here
(`use_dialect`; hybridrl/__init__.py does it once, lazily), as it hands in the algorithm registries
(config/extensions.py). Without a dialect a config is read as hybridrl's own keys and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol


class Dialect(Protocol):
    def compose(self, path: Path, read: Callable[[Path], dict], errors: list[str]) -> dict:
        """The tree of a file with a `defaults:` list, the files it names merged in (`read` reads one
        YAML file, appending to `errors`)."""

    def base(self, entry: str) -> dict:
        """The tree a command line of the framework's entry point `entry` starts from (its defaults)."""

    def translate(self, tree: dict, entry: str | None, errors: list[str]) -> list[str]:
        """Rewrite the framework's keys and forms in `tree` (overrides applied) into hybridrl's, in place;
        append what cannot be honoured to `errors`; return notices, one line each. `entry`: the entry
        point of a command line with no config file, or None."""


class PlainKeys:
    """No other vocabulary: hybridrl's keys only (a `defaults:` list is an unknown key)."""

    def compose(self, path: Path, read: Callable[[Path], dict], errors: list[str]) -> dict:
        return read(path)

    def base(self, entry: str) -> dict:
        return {}

    def translate(self, tree: dict, entry: str | None, errors: list[str]) -> list[str]:
        return []


_SOURCE: list[Callable[[], Dialect]] = [PlainKeys]


def use_dialect(source: Callable[[], Dialect]) -> None:
    """Read configs through `source()` from now on (called when a config is read, so it may import late)."""
    _SOURCE[0] = source


def dialect() -> Dialect:
    return _SOURCE[0]()
