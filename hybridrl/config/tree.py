"""A raw config tree (nested dicts, before it is typed) addressed by dotted key paths.

>>> tree = {}
>>> put(tree, "data.train_batch_size", 8); get(tree, "data.train_batch_size")
8
>>> merge(tree, {"data": {"seed": 1}}); tree
{'data': {'train_batch_size': 8, 'seed': 1}}
>>> pop(tree, "data.train_batch_size"); pop(tree, "data.seed"); tree
{}
"""

from __future__ import annotations

from typing import Any


def get(tree: dict, path: str, default: Any = None) -> Any:
    """The value at `path`, or `default` when a part of it is missing."""
    node: Any = tree
    for p in path.split("."):
        if not isinstance(node, dict) or p not in node:
            return default
        node = node[p]
    return node


def put(tree: dict, path: str, value: Any) -> None:
    """Set `path` to `value`, making the sections on the way."""
    parts = path.split(".")
    node = tree
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def pop(tree: dict, path: str) -> None:
    """Remove `path` (it must exist) and the sections it leaves empty."""
    parts = path.split(".")
    nodes = [tree]
    for p in parts[:-1]:
        nodes.append(nodes[-1][p])
    nodes[-1].pop(parts[-1], None)
    for node, p in zip(reversed(nodes[:-1]), reversed(parts[:-1])):
        if node.get(p) == {}:
            node.pop(p)


def merge(into: dict, new: dict) -> None:
    """Deep-merge `new` into `into` in place (mappings merge key by key; anything else replaces)."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v


def leaves(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) of every leaf; an empty mapping is a leaf."""
    out = []
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += leaves(v, path + ".")
        else:
            out.append((path, v))
    return out
