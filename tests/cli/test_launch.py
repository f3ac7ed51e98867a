"""hybridrl/launch.py: the one launch path both front doors use (the CLI and the Python API)."""

import ast
from pathlib import Path

import pytest

from hybridrl import launch
from hybridrl.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }


def test_neither_front_door_imports_the_other():
    api, cli = _imports(ROOT / "hybridrl/api.py"), _imports(ROOT / "hybridrl/cli/main.py")
    assert "hybridrl.launch" in cli and ("hybridrl.launch" in api or "hybridrl" in api)
    assert not any(m.startswith("hybridrl.cli") for m in api)
    assert "hybridrl.api" not in cli
    source = (ROOT / "hybridrl/api.py").read_text()
    assert "_find_resume" not in source and "_device_problems" not in source and "_check_reward_file" not in source


@pytest.mark.parametrize(
    "name, trainer",
    [
        ("rl", "PPOTrainer"),
        ("dpo", "PreferenceTrainer"),
        ("kto", "PreferenceTrainer"),
        ("sft", "SFTTrainer"),
        ("rm", "RewardModelTrainer"),
    ],
)
def test_trainer_class_follows_algorithm_name(name, trainer):
    cfg = Config()
    cfg.algorithm.name = name
    assert launch.trainer_class(cfg).__name__ == trainer


def test_user_errors_are_one_line_and_bugs_are_none():
    one = launch.user_error_message(ConfigError(["data.train_files is empty"]), None, "run.yaml")
    assert one == "run.yaml: data.train_files is empty"
    two = launch.user_error_message(ConfigError(["a\nb", "c"]), None, None)
    assert two == "2 problems in the config: (1) a b; (2) c"
    assert launch.user_error_message(launch.UsageError("needs --input"), None) == "needs --input"
    assert launch.user_error_message(KeyError("a bug"), None) is None  # shown with its traceback


def test_a_reward_file_that_fails_on_import_names_its_line(tmp_path):
    bad = tmp_path / "reward.py"
    bad.write_text("x = 1\nraise RuntimeError('no')\n")
    cfg = Config()
    cfg.custom_reward_function.path, cfg.custom_reward_function.name = str(bad), "compute_score"
    with pytest.raises(ConfigError, match=r"reward.py', line 2: importing it raised RuntimeError: no"):
        launch.check_reward_file(cfg)
