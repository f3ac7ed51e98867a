"""`hybridrl train` into directories it did not make: a folder of another program's files (a
`config.yaml` that is not a hybridrl run's) is refused in one line and left as it is; the current
directory (`trainer.default_local_dir=.`) is never renamed from under the process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from badinput_common import BASE_YAML, assert_one_line_error, run_in_process  # noqa: E402


@pytest.fixture
def base(tmp_path, tiny_model_dir, arith_data):
    cfg = tmp_path / "c.yaml"
    fmt = dict(model=tiny_model_dir, train=arith_data["train"], test=arith_data["test"], precious=tmp_path / "run")
    cfg.write_text(BASE_YAML.format(**fmt))
    return cfg


@pytest.mark.parametrize("overwrite", ["false", "true"])
def test_a_folder_of_another_programs_files_is_refused_untouched(base, tmp_path, capfd, overwrite):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "config.yaml").write_text("name: my-project\nsteps: 3\n")
    (folder / "notes.txt").write_text("mine")
    rc, _, err = run_in_process(
        ["train", str(base), f"trainer.default_local_dir={folder}", f"trainer.overwrite={overwrite}"], capfd
    )
    assert_one_line_error(rc, err, [f"{folder} holds config.yaml that hybridrl did not write", "trainer.default_local_dir"])
    assert sorted(os.listdir(tmp_path)) == ["c.yaml", "project"]
    assert sorted(os.listdir(folder)) == ["config.yaml", "notes.txt"]
    assert (folder / "config.yaml").read_text() == "name: my-project\nsteps: 3\n"


def test_the_current_directory_holding_a_run_is_one_line(base, tmp_path, capfd, monkeypatch):
    """default_local_dir=. where a run trained: refused naming the choices; with overwrite, refused
    because the directory the process stands in cannot be moved aside under it."""
    here = tmp_path / "here"
    here.mkdir()
    (here / "config.yaml").write_text("# hybridrl config, resolved\ntrainer: {}\n")
    (here / "metrics.jsonl").write_text('{"step": 1}\n')
    monkeypatch.chdir(here)
    rc, _, err = run_in_process(["train", str(base), "trainer.default_local_dir=."], capfd)
    assert_one_line_error(rc, err, ["already holds a run", "trainer.resume_mode=auto"])
    rc, _, err = run_in_process(["train", str(base), "trainer.default_local_dir=.", "trainer.overwrite=true"], capfd)
    assert_one_line_error(rc, err, ["it is the current directory"])
    assert sorted(os.listdir(here)) == ["config.yaml", "metrics.jsonl"] and sorted(os.listdir(tmp_path)) == ["c.yaml", "here"]
