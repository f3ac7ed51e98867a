"""verl's config files and command lines as the config loader reads them (config/dialect.py's `Dialect`).

In the order the loader applies them to a tree that holds the file and the command line's overrides:
Hydra's `_target_` dropped and `${...}` resolved (`hydra`), verl's keys translated (`keys.translate`),
and for a verl command line with no config file, verl's engine and logger names (`keys.verl_argv`).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from pathlib import Path

from hybridrl.config.schema import Config, walk

from . import hydra, keys


@functools.cache
def _schema() -> tuple[set[str], set[str], dict, dict]:
    """(every key path, the keys holding free-form mappings, the default per key, the defaults as a tree)."""
    entries = list(walk(Config()))
    known = {e.path for e in entries}
    dict_keys = {e.path for e in entries if not e.is_section and (e.type is dict or typing.get_origin(e.type) is dict)}
    return known, dict_keys, {e.path: e.value for e in entries}, dataclasses.asdict(Config())


class VerlDialect:
    def compose(self, path: Path, read: Callable[[Path], dict], errors: list[str]) -> dict:
        return hydra.compose(path, read, errors)

    def base(self, entry: str) -> dict:
        return keys.verl_base(entry)

    def translate(self, tree: dict, entry: str | None, errors: list[str]) -> list[str]:
        known, dict_keys, defaults, default_tree = _schema()
        hydra.drop_targets(tree)
        hydra.resolve_interpolations(tree, default_tree, errors)  # ${...}, after the overrides, as Hydra
        translation = keys.translate(tree, known, dict_keys, defaults)
        if entry:
            keys.verl_argv(tree, translation)
        errors.extend(translation.errors)
        return translation.notices
