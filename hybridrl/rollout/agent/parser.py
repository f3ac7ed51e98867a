"""Tool calls out of a model turn's text, in the chat formats `multi_turn.format` names.

- `hermes`: Qwen2.5 / Hermes function calling, what their chat templates teach when given
  `tools=`: one or more `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.
- `code`: plain fenced code; every ```python block of the turn is a call of the `python` tool
  (models that write code unprompted, e.g. Qwen2.5-Coder, need no tool-calling template).

A call that cannot be parsed is still returned, with `error` set: the agent answers it with the
error text so the model sees what went wrong, and it counts in `agent/tool_errors`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("hermes", "code")

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_CODE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


@dataclass
class ToolCall:
    name: str
    args: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the call could not be parsed (then it is not run)


def parse_tool_calls(text: str, fmt: str) -> list[ToolCall]:
    """The tool calls in one assistant turn, in order (empty: the turn calls no tool)."""
    if fmt == "hermes":
        return [_hermes_call(body) for body in _HERMES.findall(text)]
    if fmt == "code":
        return [ToolCall("python", {"code": body}) for body in _CODE.findall(text) if body.strip()]
    raise ValueError(f"unknown multi_turn.format {fmt!r}; choose one of {', '.join(FORMATS)}")


def _hermes_call(body: str) -> ToolCall:
    try:
        call = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"the tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    args = call.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(call["name"], error=f"the arguments are not valid JSON ({e.msg})")
    if not isinstance(args, dict):
        return ToolCall(call["name"], error="the arguments must be a JSON object")
    return ToolCall(call["name"], args)
