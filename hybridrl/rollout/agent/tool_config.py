"""Tool config files (`actor_rollout_ref.rollout.multi_turn.tool_config_path`), in verl's shape:

    tools:
      - class_name: python              # a registered tool name, or a dotted path pkg.module.Class
        config: {wall_timeout_s: 5}     # passed to the tool's constructor
        tool_schema:                    # optional: overrides the tool's name, description, parameters
          type: function
          function: {name: run_python, description: ..., parameters: {...}}

verl's own class paths (`verl.tools...`) cannot be imported here; they are refused with the
names of hybridrl's tools.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from hybridrl.config import yamlio
from hybridrl.rollout.agent.tool import Tool, registered_tools


def load_tool_config(path: str | Path) -> list[Tool]:
    """The tools a config file lists, constructed, in order; ValueError naming the file, the
    entry and the fix for anything malformed."""
    path = Path(path)
    try:
        doc = yamlio.load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tools"), list):
        raise ValueError(f"{path}: a tool config is a mapping with a `tools:` list (tools: [{{class_name: python}}])")
    tools, names = [], {}
    for i, entry in enumerate(doc["tools"]):
        where = f"{path}, tools[{i}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ValueError(f"{where}: each entry is a mapping with a class_name (a tool name or pkg.module.Class)")
        unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; an entry has class_name, config and tool_schema")
        cls = _tool_class(entry["class_name"], where)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ValueError(f"{where}: config must be a mapping, got {type(config).__name__}")
        config = {k: v for k, v in config.items() if not (k == "type" and v == "native")}  # verl's marker
        try:
            tool = cls(config)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {entry['class_name']}: {e}") from None
        _apply_schema(tool, entry.get("tool_schema"), where)
        if tool.name in names:
            raise ValueError(
                f"{where}: a second tool named {tool.name!r} (the first is tools[{names[tool.name]}]); names must differ"
            )
        names[tool.name] = i
        tools.append(tool)
    return tools


def _tool_class(name: Any, where: str) -> type[Tool]:
    import hybridrl.rollout.agent.builtin_tools  # noqa: F401  (registers python, calculator; imports the sandbox)

    registry = registered_tools()
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: class_name must be a string")
    if name in registry:
        return registry[name]
    if name.startswith("verl."):
        raise ValueError(
            f"{where}: class_name {name!r} is verl's; hybridrl cannot run verl's tool classes. Use one of hybridrl's "
            f"({', '.join(sorted(registry))}) or your own Tool subclass (docs/sandbox.md)"
        )
    module, _, attr = name.rpartition(".")
    if not module:
        raise ValueError(
            f"{where}: unknown tool {name!r}; registered tools: {', '.join(sorted(registry))}, or give pkg.module.Class"
        )
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}: cannot import {name!r} ({type(e).__name__}: {e})") from None
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise ValueError(f"{where}: {name!r} is not a subclass of hybridrl.rollout.agent.tool.Tool")
    return cls


def _apply_schema(tool: Tool, schema: Any, where: str) -> None:
    if schema is None:
        if not tool.name:
            raise ValueError(f"{where}: the tool has no name; give a tool_schema with function.name")
        return
    fn = schema.get("function") if isinstance(schema, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"{where}: tool_schema must look like {{type: function, function: {{name: ..., parameters: {{...}}}}}}")
    params = fn.get("parameters", tool.parameters)
    if not isinstance(params, dict):
        raise ValueError(f"{where}: tool_schema.function.parameters must be a JSON schema object")
    tool.name, tool.description, tool.parameters = fn["name"], fn.get("description", tool.description), params
