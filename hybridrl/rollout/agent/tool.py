"""The tool interface of agent rollouts, and the registry that maps tool names to classes.

A tool is a named function the model may call mid-response. It declares a JSON schema (what the
chat template shows the model) and runs asynchronously, so the agent loop can run many calls at
once while other sequences keep decoding. Built-in tools live in `builtin_tools.py`; users add
their own with `@register_tool("name")` in a module listed in the config's `extensions:`, or by
class path in a tool config file (verl's `tool_config_path` shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

_TOOLS: dict[str, type["Tool"]] = {}


@dataclass
class ToolResult:
    """What a call gives back: `text` is appended to the conversation as a tool message;
    `reward` adds to the trajectory's final reward (e.g. a penalty for a failed call); `error`
    marks a failed call (counted in the `agent/tool_errors` metric)."""

    text: str
    reward: float = 0.0
    error: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


class Tool:
    """Subclass and set `name`, `description`, `parameters` (a JSON schema object); implement `execute`.

    `config` is the tool's `config:` mapping from the tool config file (empty when built from Python).
    `state` passed to `execute` is one dict per trajectory, shared by all calls of that trajectory;
    it starts with the data row's fields the agent loop exposes (`ground_truth`, `extra_info`, ...).
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = dict(config or {})

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form chat templates (`tools=`) expect."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}

    async def execute(self, args: dict[str, Any], state: dict[str, Any]) -> ToolResult:
        raise NotImplementedError

    async def release(self, state: dict[str, Any]) -> None:
        """Called once when the trajectory ends (free per-trajectory resources)."""


def register_tool(name: str) -> Callable[[type[Tool]], type[Tool]]:
    """Class decorator: make a Tool subclass available by `name` in configs."""

    def wrap(cls: type[Tool]) -> type[Tool]:
        if not (isinstance(cls, type) and issubclass(cls, Tool)):
            raise TypeError(f"@register_tool({name!r}) expects a subclass of hybridrl.rollout.agent.tool.Tool, got {cls!r}")
        if name in _TOOLS and _TOOLS[name] is not cls:
            raise ValueError(f"tool name {name!r} is already registered by {_TOOLS[name].__module__}.{_TOOLS[name].__qualname__}")
        cls.name = cls.name or name
        _TOOLS[name] = cls
        return cls

    return wrap


def registered_tools() -> dict[str, type[Tool]]:
    """Name -> class of every tool registered so far (the built-ins once `builtin_tools` is imported,
    which `tool_config` does before it looks a name up)."""
    return dict(_TOOLS)
