"""verl's config files are Hydra configs: this reads them the way verl's Hydra tree does.

- A `defaults:` list composes other files of the same directory tree, each entry merged in order
  (a later one wins, dicts merged key by key, lists replaced):
    - `group@package: option` reads `<dir>/<group>/<option>.yaml` into `package`, relative to the
      package of the file that names it (`_global_` for the root); without `@package`, into the
      group's own path (`optim: fsdp` -> `optim`). `../group` looks beside the file's directory.
      `option: null` skips the entry; `optional` skips a file that does not exist; `override`
      (a primary file replacing a default) is read as a plain entry.
    - a bare `name` reads `<dir>/<name>.yaml` into the file's own package;
    - `_self_` is where the file's own keys go; without it, after every entry (Hydra >= 1.1).
  A `# @package _global_` (or `# @package a.b`) header places a file's content elsewhere, as in Hydra.
- `${a.b.c}` interpolations (and OmegaConf's resolvers: `${oc.env:VAR,default}`,
  `${oc.select:key,default}`, relative `${..key}`) are resolved by OmegaConf after the command
  line's overrides are applied, so `data.max_prompt_length=256` moves every value that names it.
  A key a file does not hold resolves against hybridrl's default for it.
- `_target_` (Hydra's instantiation class) says which class verl builds; hybridrl builds its own: dropped.

OmegaConf is the library Hydra is built on, so `${...}` means here exactly what it means in verl.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hybridrl.config import yamlio
from hybridrl.config.tree import merge

_PACKAGE_HEADER = re.compile(r"^#\s*@package\s+(\S+)", re.M)


def has_hydra(tree: Any) -> bool:
    """Whether a raw tree uses a defaults list, an interpolation or `_target_`."""
    if isinstance(tree, dict):
        return "defaults" in tree or "_target_" in tree or any(has_hydra(v) for v in tree.values())
    if isinstance(tree, list):
        return any(has_hydra(v) for v in tree)
    return isinstance(tree, str) and "${" in tree


# A defaults tree composes each file once per entry that names it: a file named twice in every
# level's list would grow exponentially (2^depth reads). verl's trainer tree composes ~30 files.
MAX_COMPOSED = 256


def compose(path: Path, read: Callable[[Path], dict], errors: list[str]) -> dict:
    """The file at `path` with its defaults list (and theirs) merged in, as one tree. Entries are
    read inside the primary file's directory (the config root: `/group` is relative to it, as in
    Hydra); one leading outside it, a file that is not a regular file (a FIFO, a directory), the
    same file twice in one list, or more than MAX_COMPOSED files in all are errors."""
    out: dict = {}
    path = Path(path)
    _compose(path, read, errors, package=[], into=out, seen=(), tree_state={"root": path.parent.resolve(), "files": 0})
    return out


def _compose(path: Path, read, errors: list[str], package: list[str], into: dict, seen: tuple, tree_state: dict) -> None:
    if path.resolve() in seen:
        errors.append(f"{path}: its defaults list includes itself (through {' -> '.join(p.name for p in seen)})")
        return
    tree_state["files"] += 1
    if tree_state["files"] > MAX_COMPOSED:
        if tree_state["files"] == MAX_COMPOSED + 1:
            errors.append(f"{path}: the defaults lists compose more than {MAX_COMPOSED} files (one included over and over?)")
        return
    seen = (*seen, path.resolve())
    if path.exists() and not path.is_file():  # a FIFO would block the read, a directory fail it
        errors.append(f"{path}: not a regular file; a defaults entry names a YAML file")
        return
    header = _PACKAGE_HEADER.search(path.read_text(errors="replace")[:2000]) if path.exists() else None
    if header:
        package = [] if header.group(1) == "_global_" else header.group(1).split(".")
    tree = read(path)
    defaults = tree.pop("defaults", []) if isinstance(tree, dict) else []
    if not isinstance(defaults, list):
        errors.append(f"{path}: 'defaults' must be a list (of group: option entries and _self_)")
        return
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    named: set[tuple] = set()  # (file, package): one file may go to two packages (optim@actor, optim@critic)
    for entry in defaults:
        if entry == "_self_":
            merge(_at(into, package), tree)
            continue
        for group, option, optional, where in _entries(entry, path, package, errors):
            if option is None:
                continue
            base = tree_state["root"] / group.lstrip("/") if group.startswith("/") else path.parent / group
            file = base / f"{option}.yaml"
            if not file.resolve().is_relative_to(tree_state["root"]):
                errors.append(
                    f"{path}: defaults entry {entry!r} names {file}, outside the config directory {tree_state['root']} "
                    "(entries are read inside it; `/group` starts at it)"
                )
                continue
            if (file.resolve(), tuple(where)) in named:
                errors.append(f"{path}: defaults entry {entry!r} names {file} a second time in this list; name it once")
                continue
            named.add((file.resolve(), tuple(where)))
            if not file.exists():
                if not optional:
                    errors.append(f"{path}: defaults entry {entry!r} names {file}, which does not exist")
                continue
            _compose(file, read, errors, where, into, seen, tree_state)


def _entries(entry: Any, path: Path, package: list[str], errors: list[str]):
    """(group dir or "", option, optional, package) for one defaults entry."""
    if isinstance(entry, str):  # a config of this directory (`/name`: of the root), into this file's package
        group, _, name = entry.rpartition("/")
        return [(group or ("/" if entry.startswith("/") else ""), name, False, package)]
    if not (isinstance(entry, dict) and len(entry) == 1):
        errors.append(f"{path}: defaults entry {entry!r} is not `group: option`, `group@package: option` or a name")
        return []
    ((key, option),) = entry.items()
    words = str(key).split()
    optional = "optional" in words[:-1]
    group, _, pkg = words[-1].partition("@")
    if pkg == "_global_" or pkg.startswith("_global_."):
        where = [p for p in pkg.split(".")[1:] if p]
    elif pkg:
        where = [*package, *pkg.split(".")]
    elif group.startswith("/"):  # an absolute group: its path from the root
        where = [p for p in group.split("/") if p not in ("", "..", ".")]
    else:  # Hydra's default package: the group's path
        where = [*package, *[p for p in group.split("/") if p not in ("", "..", ".")]]
    options = option if isinstance(option, list) else [option]
    return [(group, o, optional, where) for o in options]


def _at(tree: dict, package: list[str]) -> dict:
    node = tree
    for p in package:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    return node


def drop_targets(tree: Any) -> None:
    """Remove Hydra's `_target_` keys (verl's config classes) in place."""
    if isinstance(tree, dict):
        tree.pop("_target_", None)
        for v in tree.values():
            drop_targets(v)
    elif isinstance(tree, list):
        for v in tree:
            drop_targets(v)


def resolve_interpolations(tree: dict, defaults: dict, errors: list[str]) -> None:
    """Replace every `${...}` in `tree` (in place) by its value, OmegaConf's way, with `defaults`
    (hybridrl's config as a dict) standing in for keys the tree does not hold."""
    if not has_hydra(tree):
        return
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    deep = [f"{key}: `${{...}}` nested {n} deep (at most {MAX_NESTING})" for key, n in _nesting(tree, "") if n > MAX_NESTING]
    if deep:  # OmegaConf's parser recurses (and backtracks) through each level
        errors.extend(deep)
        return
    context = _plain(defaults)
    merge(context, copy.deepcopy(tree))
    try:
        resolved = OmegaConf.to_container(OmegaConf.create(context), resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        msg = " ".join(str(e).splitlines()[0].split())
        errors.append(f"{key + ': ' if key else ''}cannot resolve an interpolation: {msg}")
        return
    except RecursionError:  # interpolations that name each other thousands of times over
        errors.append("cannot resolve the interpolations: they refer to each other too deeply")
        return
    _copy_back(tree, resolved)


MAX_NESTING = 32  # `${a:${b:...}}` levels in one value; verl's configs nest 2


def _nesting(tree: Any, prefix: str):
    """(key, deepest `${` nesting of its text) for every text value in `tree`."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, str) and "${" in v:
            depth = most = 0
            for m in re.finditer(r"\$\{|\}", v):
                depth = depth + 1 if m.group() == "${" else max(0, depth - 1)
                most = max(most, depth)
            yield key, most
        elif isinstance(v, (dict, list)):
            yield from _nesting(v, f"{key}.")


def _plain(d: Any) -> Any:
    """A dict OmegaConf accepts (tuples as lists)."""
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items()}
    if isinstance(d, (list, tuple)):
        return [_plain(v) for v in d]
    return d


def _copy_back(tree: dict, resolved: dict) -> None:
    for k, v in tree.items():
        if isinstance(v, dict) and isinstance(resolved.get(k), dict):
            _copy_back(v, resolved[k])
        else:
            tree[k] = _typed(v, resolved.get(k, v))


def _typed(written: Any, value: Any) -> Any:
    """A whole-value resolver's text (`${oc.env:STEPS,3}` gives '3') read as YAML, as a command-line
    value is: the number 3. Text around an interpolation (`runs/${name}`) stays text."""
    if isinstance(written, str) and isinstance(value, str) and _WHOLE.fullmatch(written.strip()):
        try:
            return yamlio.load(value) if value.strip() else value
        except yaml.YAMLError:
            return value
    return value


_WHOLE = re.compile(r"\$\{[^{}]*\}")
