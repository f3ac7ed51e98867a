"""Checks on names and files the config points at (hybridrl/config/checks_files.py): `explain` and
`train` load the same config, so both give the same verdict."""

from __future__ import annotations

import pytest

from hybridrl.config import load_config, validate

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]


def problems(*overrides):
    return validate(load_config(None, [*REQUIRED, *overrides], check=False))


@pytest.mark.parametrize("key", ["trainer.experiment_name", "trainer.project_name"])
@pytest.mark.parametrize("value", ["../../x", "/tmp/x", "a/b", ".."])
def test_run_names_that_leave_the_runs_folder_are_refused(key, value):
    found = [p for p in problems(f"{key}={value}") if p.startswith(key)]
    assert len(found) == 1 and "one plain name" in found[0] and "trainer.default_local_dir" in found[0]


def test_plain_run_names_pass():
    assert not [p for p in problems("trainer.experiment_name=grpo-7b_v2.1", "trainer.project_name=gsm8k") if "_name" in p]


# -- files the config points at: explain loads them as train does ---------------------------------
MT = "actor_rollout_ref.rollout.multi_turn"

BAD_TOOLS = {
    "syntax": ("tools: [class_name: calculator\n", "not valid YAML"),
    "shape": ("- class_name: calculator\n", "a mapping with a `tools:` list"),
    "unknown_key": ("tools:\n  - class_name: calculator\n    confg: {}\n", "unknown key(s) ['confg']"),
    "unimportable": ("tools:\n  - class_name: no_such_pkg.tools.Search\n", "cannot import 'no_such_pkg.tools.Search'"),
    "not_a_tool": ("tools:\n  - class_name: collections.OrderedDict\n", "is not a subclass"),
}
BAD_INTERACTIONS = {
    "syntax": ("interaction: [{name: a\n", "not valid YAML"),
    "shape": ("interaction: {name: a}\n", "`interaction:` list"),
    "unknown_key": ("interaction:\n  - name: g\n    class_name: gsm8k\n    cfg: {}\n", "unknown key(s) ['cfg']"),
    "unimportable": ("interaction:\n  - class_name: nowhere.Judge\n", "cannot import 'nowhere.Judge'"),
}


def _path_problems(*overrides):
    from hybridrl.config.paths import missing_paths

    return [p for p in missing_paths(load_config(None, [*REQUIRED, *overrides], check=False)) if "multi_turn" in p]


@pytest.mark.parametrize("case", sorted(BAD_TOOLS))
def test_bad_tool_configs_are_found_before_loading(tmp_path, case):
    text, expected = BAD_TOOLS[case]
    (tmp_path / "tools.yaml").write_text(text)
    found = _path_problems(f"{MT}.enable=true", f"{MT}.tool_config_path={tmp_path / 'tools.yaml'}")
    assert len(found) == 1 and expected in found[0] and "tools.yaml" in found[0], found


@pytest.mark.parametrize("case", sorted(BAD_INTERACTIONS))
def test_bad_interaction_configs_are_found_before_loading(tmp_path, case):
    text, expected = BAD_INTERACTIONS[case]
    (tmp_path / "inter.yaml").write_text(text)
    found = _path_problems(f"{MT}.enable=true", f"{MT}.interaction_config_path={tmp_path / 'inter.yaml'}")
    assert len(found) == 1 and expected in found[0], found


def test_shipped_tool_configs_pass():
    assert _path_problems(f"{MT}.enable=true", f"{MT}.tool_config_path=configs/tools/calculator.yaml") == []


def _verdicts(tmp_path, *overrides):
    """(explain, train): exit code and stderr of each on the same command line."""
    from cli_helpers import cli

    (tmp_path / "empty.yaml").write_text("{}\n")
    args = [tmp_path / "empty.yaml", *overrides]
    return [cli(cmd, *args, check=False) for cmd in ("explain", "train")]


@pytest.mark.slow  # the CLI's explain and train
@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["reward_model.enable=true"], "reward_model.enable=true needs reward_model.model.path"),
        (["reward_model.enable=true", "reward_model.model.path=/etc"], "reward_model.model.path='/etc' has no config.json"),
        (["data.train_batch_size=1000000000000000000000000000000"], "is larger than the training set (64 "),
        ([f"{MT}.enable=true", f"{MT}.tool_config_path=TOOLS"], "unknown key(s) ['confg']"),
    ],
)
def test_explain_and_train_give_one_verdict(tmp_path, tiny_model_with_weights, arith_data, overrides, expected):
    (tmp_path / "tools.yaml").write_text(BAD_TOOLS["unknown_key"][0])
    base = [
        f"actor_rollout_ref.model.path={tiny_model_with_weights}",
        f"data.train_files={arith_data['train']}",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.device=cpu",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    overrides = [o.replace("TOOLS", str(tmp_path / "tools.yaml")) for o in overrides]
    for proc in _verdicts(tmp_path, *base, *overrides):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and lines and expected in lines[-1] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_explain_names_no_path_check_when_only_paths_are_missing(tmp_path):
    from cli_helpers import cli

    (tmp_path / "empty.yaml").write_text("{}\n")
    proc = cli(
        "explain",
        tmp_path / "empty.yaml",
        "actor_rollout_ref.model.path=/nowhere/model",
        "data.train_files=/nowhere/t.jsonl",
        check=False,
    )
    assert proc.returncode == 2 and "--no-path-check" in proc.stderr.strip().splitlines()[-1], proc.stderr
