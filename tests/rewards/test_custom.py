import pickle

import pytest

from hybridrl.rewards import load_custom_reward_fn, score_batch

SOURCE = """
from dataclasses import dataclass

THRESHOLD = 3

@dataclass
class Helper:
    n: int

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) >= THRESHOLD)

def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": len(solution_str) / 10, "len": len(solution_str)}
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_loads_default_name(reward_file):
    fn = load_custom_reward_fn(str(reward_file))
    assert fn(data_source="x", solution_str="abcd", ground_truth="", extra_info=None) == 1.0
    assert fn(data_source="x", solution_str="ab", ground_truth="", extra_info=None) == 0.0


def test_loads_other_name_and_works_with_score_batch(reward_file):
    fn = load_custom_reward_fn(reward_file, name="length_reward")
    result = score_batch(fn, ["x", "x"], ["abcde", "a"], ["", ""], [None, None])
    assert result.scores == [0.5, 0.1]
    assert result.extras == {"len": [5.0, 1.0]}


def test_function_pickles_by_reference(reward_file):
    fn = load_custom_reward_fn(reward_file)
    assert pickle.loads(pickle.dumps(fn)) is fn


def test_missing_file_names_path_and_config_key(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(FileNotFoundError) as err:
        load_custom_reward_fn(str(missing))
    assert "nope.py" in str(err.value)
    assert "custom_reward_function.path" in str(err.value)


def test_empty_path():
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        load_custom_reward_fn("")


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_custom_reward_fn(str(tmp_path))


def test_missing_name_lists_callables(reward_file):
    with pytest.raises(AttributeError) as err:
        load_custom_reward_fn(reward_file, name="reward")
    message = str(err.value)
    assert "'reward'" in message
    assert "Helper, compute_score, length_reward" in message
    assert "dataclass" not in message  # imported, not defined in the file


def test_not_callable(reward_file):
    with pytest.raises(TypeError, match="THRESHOLD.*int"):
        load_custom_reward_fn(reward_file, name="THRESHOLD")


def test_error_in_file_propagates(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match="boom"):
        load_custom_reward_fn(path)
