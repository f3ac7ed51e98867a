"""hybridrl/config/yamlio.py: the YAML of every user-written file (configs, tool and interaction
configs) refuses a document whose aliases expand past MAX_YAML_NODES values, and counts an alias
as the values it stands for."""

from __future__ import annotations

import time

import pytest
import yaml

from hybridrl.config import yamlio
from hybridrl.rollout.agent.interaction import load_interaction_config
from hybridrl.rollout.agent.tool_config import load_tool_config


def _bomb(levels: int, width: int = 9) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_shared_aliases_count_as_what_they_expand_to():
    node = yaml.compose("a: &a [1, 2]\nb: [*a, *a]\nc: {k: *a}\n", Loader=yamlio.Loader)
    # root 1 + keys a, b, c 3 + [1, 2] 3 + [*a, *a] 1 + 2 x 3 + {k: *a} 1 + k 1 + 3
    assert yamlio._expanded_size(node) == 19
    assert yamlio.load("a: &a [1, 2]\nb: [*a, *a]\n") == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def test_an_alias_bomb_and_a_cycle_are_refused_at_once():
    # 9 x 9 x ... : 5 levels (59,049 values) load, 6 (531,441) do not; neither takes long
    assert len(yamlio.load(_bomb(5))["a4"]) == 9
    t = time.perf_counter()
    with pytest.raises(yaml.constructor.ConstructorError, match="expand to more than 100,000 values"):
        yamlio.load(_bomb(9))
    with pytest.raises(yaml.constructor.ConstructorError, match="alias bomb"):
        yamlio.load("a: &a [1, *a]\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="alias bomb"):
        yamlio.load("a: &a {x: [*a]}\n")
    assert time.perf_counter() - t < 5


@pytest.mark.parametrize("load", [load_tool_config, load_interaction_config])
def test_tool_and_interaction_configs_refuse_a_bomb_as_a_one_line_error(tmp_path, load):
    path = tmp_path / "c.yaml"
    path.write_text(_bomb(9) + "tools: *a8\ninteraction: *a8\n")
    with pytest.raises(ValueError, match=r"c\.yaml: not valid YAML .*alias bomb"):
        load(path)
