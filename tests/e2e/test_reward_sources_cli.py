"""Reward set-up problems stop `hybridrl train` at start with one line, or do not happen at all: a
data_source no scorer knows, and a reward module that changes directory when imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import cli, one_step_args

pytestmark = pytest.mark.slow


def _args(model, train, out, *extra, config_dir=None):
    return [*one_step_args(model, train, out, config_dir=config_dir), *extra]


def _rows_with_source(src: str, dst: Path, source: str) -> str:
    from hybridrl.data.converters import read_rows

    rows = [{**r, "data_source": source} for r in read_rows(src)]
    dst.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return str(dst)


def test_an_unknown_data_source_is_refused_at_start(tiny_model_with_weights, arith_data, tmp_path):
    train = _rows_with_source(arith_data["train"], tmp_path / "mystery.jsonl", "mystery_set")
    proc = cli("train", *_args(tiny_model_with_weights, train, tmp_path / "run"), check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'mystery_set' (64 row(s)" in lines[0] and "custom_reward_function.path" in lines[0], proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_reward_module_that_changes_directory_does_not_move_the_run(tiny_model_with_weights, arith_data, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "import os\nos.chdir('/')\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str.strip() == str(ground_truth))\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "model").symlink_to(tiny_model_with_weights)
    args = _args("model", arith_data["train"], "run", f"custom_reward_function.path={reward}", config_dir=tmp_path)
    cli("train", *args, cwd=work)  # relative model path and run dir, both read after the import
    assert (work / "run" / "metrics.jsonl").exists()
