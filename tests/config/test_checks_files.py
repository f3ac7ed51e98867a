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
