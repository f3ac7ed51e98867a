"""The built-in tools: `python` (runs the model's code in a sandbox) and `calculator`.

Both are configured by the `config:` mapping of their entry in a tool config file:

    tools:
      - class_name: python
        config: {wall_timeout_s: 5, memory_mb: 1024, error_penalty: -0.1}   # or sandbox_fusion_url: http://host:8080/run_code
      - class_name: calculator
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from hybridrl.rollout.agent.tool import Tool, ToolResult, register_tool
from hybridrl.sandbox import LocalSandbox, SandboxConfig, SandboxFusionClient


@register_tool("python")
class PythonTool(Tool):
    """Runs `code` in the local sandbox (hybridrl/sandbox/) or on a SandboxFusion service and returns
    what it printed; a failed run (an exception, a timeout) returns its error output, marked as
    an error, with `error_penalty` as its reward (default 0)."""

    description = "Run Python 3 code and see what it prints (stdout). Use print() to show results."
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the Python code to run"}},
        "required": ["code"],
    }

    def __init__(self, config: dict[str, Any] | None = None):
        super().__init__(config)
        known = set(SandboxConfig.__dataclass_fields__) | {"sandbox_fusion_url", "url", "error_penalty"}
        unknown = sorted(set(self.config) - known)
        if unknown:
            raise ValueError(f"python tool: unknown config key(s) {unknown}; known: {sorted(known)}")
        self.penalty = float(self.config.get("error_penalty", 0.0))
        sandbox = SandboxConfig.from_dict(self.config)
        url = self.config.get("sandbox_fusion_url") or self.config.get("url")
        self.sandbox = SandboxFusionClient(url, sandbox) if url else LocalSandbox(sandbox)

    async def execute(self, args: dict[str, Any], state: dict[str, Any]) -> ToolResult:
        code = args.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult('error: the python tool needs {"code": "<python source>"}', self.penalty, error=True)
        r = await self.sandbox.run(code)
        if r.timed_out:
            limit = self.sandbox.config.wall_timeout_s
            text = (r.stdout + f"\nerror: the code ran longer than {limit:g} s and was stopped").strip()
            return ToolResult(text, self.penalty, error=True)
        if r.exit_code != 0:
            tail = r.stderr.strip().splitlines()[-6:]
            return ToolResult((r.stdout + "\n" + "\n".join(tail)).strip() or "error", self.penalty, error=True)
        text = r.stdout if r.stdout.strip() else "(no output; use print() to see results)"
        return ToolResult(text + ("\n...(output truncated)" if r.truncated else ""))


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCTIONS = {"sqrt": math.sqrt, "abs": abs, "round": round, "floor": math.floor, "ceil": math.ceil, "min": min, "max": max}
_CONSTANTS = {"pi": math.pi, "e": math.e}
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e100
MAX_LENGTH = 500


def evaluate_expression(text: str) -> float | int:
    """The value of an arithmetic expression: numbers, + - * / // % **, parentheses, unary signs,
    sqrt/abs/round/floor/ceil/min/max, pi and e. Anything else, exponents over 1000 in size and
    results over 1e100 raise ValueError (nothing is computed that could take long)."""
    if len(text) > MAX_LENGTH:
        raise ValueError(f"the expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip().replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression ({e.msg})") from None

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            huge = abs(right) > MAX_EXPONENT or (abs(left) > 1 and abs(right) * math.log10(abs(left)) > 100)
            if isinstance(node.op, ast.Pow) and huge:
                raise ValueError("the power is too large")
            try:
                result = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
                raise ValueError("the result is out of range")
            return result
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS and not node.keywords:
            try:
                return _FUNCTIONS[node.func.id](*[value(a) for a in node.args])
            except (TypeError, ValueError) as e:
                raise ValueError(f"{node.func.id}: {e}") from None
        raise ValueError(f"unsupported element {ast.dump(node)[:60]!r} (numbers, + - * / // % **, parentheses, sqrt, abs, round)")

    return value(tree)


@register_tool("calculator")
class CalculatorTool(Tool):
    """Evaluates an arithmetic expression (`evaluate_expression`); errors are returned as text."""

    description = "Evaluate an arithmetic expression, e.g. (12 + 7) * 3 / 2 or sqrt(2) ** 2."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "the arithmetic expression"}},
        "required": ["expression"],
    }

    async def execute(self, args: dict[str, Any], state: dict[str, Any]) -> ToolResult:
        expr = args.get("expression")
        if not isinstance(expr, str):
            return ToolResult('error: the calculator needs {"expression": "<arithmetic>"}', error=True)
        try:
            result = evaluate_expression(expr)
        except ValueError as e:
            return ToolResult(f"error: {e}", error=True)
        if isinstance(result, float) and result.is_integer() and abs(result) < 1e15:
            result = int(result)
        return ToolResult(str(result))
