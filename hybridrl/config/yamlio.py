"""The YAML every user-written file goes through (configs, tool and interaction configs, resolver
values): PyYAML's SafeLoader (no code, no Python objects) that also reads `1e-6` as a float, refuses
a mapping with a key written twice, and refuses a document whose aliases expand past
MAX_YAML_NODES values."""

from __future__ import annotations

import re
import typing
from typing import Any

import yaml

# The most nodes a config may hold once its aliases are expanded. A real config has a few hundred;
# a "billion laughs" file (aliases of aliases, 9 x 9 x ...) is small on disk and in PyYAML's shared
# objects, but every later walk of the tree (validation, merging, writing config.yaml) expands it.
MAX_YAML_NODES = 100_000


class Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-6` as a float, and refuses a document whose aliases expand
    past MAX_YAML_NODES nodes.

    PyYAML implements YAML 1.1, where a float needs a dot (`1.0e-6`) and `1e-6` is a string;
    learning rates are written `1e-6` everywhere, in files and on command lines alike.
    """

    def construct_document(self, node):
        size = _expanded_size(node)
        if size > MAX_YAML_NODES:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"its aliases (*name) expand to more than {MAX_YAML_NODES:,} values; "
                "a config this large is an alias bomb or a mistake: write the values out",
                node.start_mark,
            )
        return super().construct_document(node)


def _expanded_size(root, cap: int = MAX_YAML_NODES) -> int:
    """How many nodes the document holds with every alias expanded (a node reached twice counts
    twice), computed once per distinct node; stops counting past `cap`. Iterative: a recursion
    limit is not a size limit."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()  # the nodes on the path from the root to the one in hand
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = _children(node)
        if children_done or not kids:
            sizes[id(node)] = min(cap + 1, 1 + sum(sizes[id(k)] for k in kids))
            open_.discard(id(node))
            continue
        open_.add(id(node))
        if any(id(k) in open_ for k in kids):  # a node inside itself (&a [*a]): endless
            return cap + 1
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in sizes)
    return sizes[id(root)]


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


_FLOAT_TAG = "tag:yaml.org,2002:float"
Loader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != _FLOAT_TAG] for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
            |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
            |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
            |[-+]?\.(?:inf|Inf|INF)
            |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _construct_mapping_once(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    """A mapping in which a key appears twice is an error: YAML keeps the last one, so a second
    `actor_rollout_ref:` section would silently drop the first (a common copy-paste accident)."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if isinstance(key, typing.Hashable) and key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {key!r} appears twice (lines {seen[key]} and {line}); the first would be dropped: merge them into one",
                key_node.start_mark,
            )
        if isinstance(key, typing.Hashable):
            seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping_once)


def load(text: str) -> Any:
    """`text` as YAML through `Loader`: yaml.YAMLError (a ConstructorError for the limits above)."""
    return yaml.load(text, Loader=Loader)
