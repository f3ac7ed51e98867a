"""The built-in tools, tool and interaction config files, and the gsm8k interaction."""

from __future__ import annotations

import asyncio

import pytest

from hybridrl.rollout.agent.builtin_tools import CalculatorTool, PythonTool, evaluate_expression
from hybridrl.rollout.agent.interaction import GSM8KInteraction, load_interaction_config
from hybridrl.rollout.agent.tool import Tool, ToolResult
from hybridrl.rollout.agent.tool_config import load_tool_config
from hybridrl.sandbox import namespaces_available


@pytest.mark.parametrize(
    "expr, value",
    [
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-3**2", -9),
        ("2^10", 1024),
        ("sqrt(16)+abs(-2)", 6.0),
        ("17 % 5", 2),
    ],
)
def test_calculator_values(expr, value):
    assert evaluate_expression(expr) == value


@pytest.mark.parametrize(
    "expr, why",
    [
        ("9**9**9", "too large"),
        ("2**5000", "too large"),
        ("1/0", "division by zero"),
        ("__import__('os').system('ls')", "unsupported"),
        ("x + 1", "unsupported"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 600, "longer than"),
    ],
)
def test_calculator_refuses(expr, why):
    with pytest.raises(ValueError, match=why):
        evaluate_expression(expr)


def test_calculator_tool_answers_text():
    tool = CalculatorTool()
    assert asyncio.run(tool.execute({"expression": "12*(3+4)"}, {})) == ToolResult("84")
    bad = asyncio.run(tool.execute({"expression": "1/0"}, {}))
    assert bad.error and bad.text == "error: division by zero"
    assert asyncio.run(tool.execute({}, {})).error


@pytest.mark.skipif(namespaces_available() is not None, reason="no Linux namespaces here")
def test_python_tool_end_to_end():
    tool = PythonTool({"wall_timeout_s": 2, "error_penalty": -0.5})
    assert asyncio.run(tool.execute({"code": "print(2 + 3)"}, {})) == ToolResult("5\n")
    failed = asyncio.run(tool.execute({"code": "1/0"}, {}))
    assert failed.error and failed.reward == -0.5 and "ZeroDivisionError" in failed.text
    slow = asyncio.run(tool.execute({"code": "import time; print('a', flush=True); time.sleep(9)"}, {}))
    assert slow.error and slow.text.startswith("a\n") and "ran longer than 2 s" in slow.text
    assert "no output" in asyncio.run(tool.execute({"code": "x = 1"}, {})).text
    assert asyncio.run(tool.execute({"code": 5}, {})).error
    with pytest.raises(ValueError, match="unknown config key"):
        PythonTool({"timeout": 3})


class Echo(Tool):
    name = "echo"

    async def execute(self, args, state):
        return ToolResult(str(args))


def test_tool_config_file(tmp_path):
    p = tmp_path / "tools.yaml"
    p.write_text(
        "tools:\n"
        "  - class_name: calculator\n"
        "  - class_name: test_tools.Echo\n"
        "    config: {type: native}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function: {name: say, description: repeat, parameters: {type: object, properties: {x: {type: string}}}}\n"
    )
    calc, echo = load_tool_config(p)
    assert calc.name == "calculator" and type(echo).__name__ == "Echo"  # imported by its dotted path
    assert echo.schema() == {
        "type": "function",
        "function": {
            "name": "say",
            "description": "repeat",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
        },
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("- class_name: calculator\n", "a `tools:` list"),
        ("tools:\n  - calculator\n", r"tools\[0\]: each entry is a mapping"),
        ("tools:\n  - class_name: nope\n", "unknown tool 'nope'; registered tools: calculator, python"),
        ("tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n", "is verl's"),
        ("tools:\n  - class_name: os.path.join\n", "not a subclass"),
        ("tools:\n  - class_name: calculator\n  - class_name: calculator\n", r"tools\[1\]: a second tool named 'calculator'"),
        ("tools:\n  - class_name: calculator\n    extra: 1\n", "unknown key"),
        ("tools:\n  - class_name: calculator\n    tool_schema: {function: {}}\n", "tool_schema must look like"),
        ("tools: [\n", "not valid YAML"),
    ],
)
def test_malformed_tool_configs(tmp_path, text, message):
    p = tmp_path / "tools.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_tool_config(p)


def test_interaction_config_and_the_gsm8k_teacher(tmp_path):
    p = tmp_path / "i.yaml"
    p.write_text(
        "interaction:\n  - name: teacher\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
        "    config: {max_retries: 1}\n"
    )
    teacher = load_interaction_config(p)["teacher"]
    assert isinstance(teacher, GSM8KInteraction)

    def talk(answers):
        state = {"ground_truth": "18", "interaction_kwargs": {}}
        asyncio.run(teacher.start(state))
        turns = [asyncio.run(teacher.respond([{"role": "assistant", "content": a}], state)) for a in answers]
        return [(t.done, t.reward, bool(t.text)) for t in turns]

    assert talk(["so #### 18"]) == [(True, 1.0, False)]
    assert talk(["#### 17", "#### 18"]) == [(False, 0.0, True), (True, 1.0, False)]
    assert talk(["#### 17", "#### 16"]) == [(False, 0.0, True), (True, 0.0, False)]


@pytest.mark.parametrize(
    "text, message",
    [
        ("interaction: []\n", "an `interaction:` list"),
        ("interaction:\n  - name: a\n    class_name: nope\n", "unknown interaction 'nope'"),
        ("interaction:\n  - name: a\n    class_name: verl.interactions.other.X\n", "is verl's"),
        ("interaction:\n  - {name: a, class_name: gsm8k}\n  - {name: a, class_name: gsm8k}\n", "a second interaction named 'a'"),
        ("interaction:\n  - {name: a, class_name: gsm8k, config: {max_retries: -1}}\n", "max_retries must be >= 0"),
    ],
)
def test_malformed_interaction_configs(tmp_path, text, message):
    p = tmp_path / "i.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_interaction_config(p)


def test_shipped_tool_and_interaction_configs_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "configs"
    tools = {p.name: [t.name for t in load_tool_config(p)] for p in sorted((root / "tools").glob("*.yaml"))}
    assert tools == {"calculator.yaml": ["calculator"], "python.yaml": ["python"]}
    assert list(load_interaction_config(root / "interactions" / "gsm8k.yaml")) == ["gsm8k"]
