"""verl YAML `defaults:` lists and `${...}` that could hang or escape (hybridrl/config/hydra.py,
hybridrl/config/loader.py): each is one ConfigError line, quickly."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hybridrl.config import ConfigError, load_config


def _tree(root: Path, files: dict[str, str | None]) -> Path:
    """Write `files` (None: a FIFO, "DIR": a directory) under root; the first is the primary file."""
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            os.mkfifo(p)
        elif text == "DIR":
            p.mkdir()
        else:
            p.write_text(text)
    return root / next(iter(files))


def _error(path: Path, overrides=()) -> str:
    started = time.monotonic()
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides), check=False)
    assert time.monotonic() - started < 10
    return str(e.value)


def _doubling(n: int, entry: str) -> dict[str, str]:
    """Level i names level i + 1 twice: 2^n compositions if nothing stops it."""
    files = {"main.yaml": "defaults:\n  - l0\n  - _self_\n"}
    for i in range(n):
        files[f"l{i}.yaml"] = f"defaults:\n  - {entry.format(i + 1)}\n  - {entry.format(i + 1).replace('@a', '@b')}\nk{i}: 1\n"
    files[f"l{n}.yaml"] = "x: 1\n"
    return files


def test_a_file_named_twice_in_one_list_is_refused(tmp_path):
    msg = _error(_tree(tmp_path, _doubling(30, "l{}")))
    assert "defaults entry 'l30' names" in msg and "a second time in this list; name it once" in msg


def test_compositions_are_bounded(tmp_path):
    """The same file into two packages per level (allowed: optim@actor and optim@critic) still
    grows as 2^depth: more than 256 files is an error, found in a bounded time."""
    msg = _error(_tree(tmp_path, _doubling(30, ".@a: l{}")))
    assert "the defaults lists compose more than 256 files" in msg


@pytest.mark.parametrize("kind", [None, "DIR"], ids=["fifo", "directory"])
def test_an_entry_that_is_not_a_regular_file(tmp_path, kind):
    path = _tree(tmp_path, {"main.yaml": "defaults:\n  - other\n  - _self_\n", "other.yaml": kind})
    assert f"{tmp_path / 'other.yaml'}: not a regular file" in _error(path)


def test_a_fifo_or_directory_as_the_config_file_itself(tmp_path):
    os.mkfifo(tmp_path / "c.yaml")
    assert "cannot read config file" in _error(tmp_path / "c.yaml") and "it is a FIFO" in _error(tmp_path / "c.yaml")
    assert "it is a directory" in _error(tmp_path)


def test_interpolations_and_brackets_nested_thousands_deep(tmp_path):
    deep = "${oc.select:x," * 3000 + "y" + "}" * 3000
    path = _tree(tmp_path, {"main.yaml": "defaults:\n  - _self_\ntrainer:\n  project_name: p\n"})
    msg = _error(path, [f"trainer.experiment_name='{deep}'"])
    assert "trainer.experiment_name: `${...}` nested 3000 deep (at most 32)" in msg
    (tmp_path / "main.yaml").write_text(f"trainer:\n  experiment_name: '{deep}'\n")
    assert "not valid YAML (brackets nested more than 64 deep)" in _error(tmp_path / "main.yaml")
    (tmp_path / "main.yaml").write_text("trainer:\n  x: " + "[" * 3000 + "]" * 3000 + "\n")
    assert "not valid YAML (brackets nested more than 64 deep)" in _error(tmp_path / "main.yaml")


@pytest.mark.parametrize(
    "entry", ["../outside", "../g@trainer: o", "sub/../../outside"], ids=["up-name", "up-group", "up-through-a-group"]
)
def test_entries_leading_outside_the_config_directory_are_refused(tmp_path, entry):
    path = _tree(
        tmp_path,
        {
            "conf/main.yaml": f"defaults:\n  - {entry}\n  - _self_\n",
            "outside.yaml": "trainer:\n  experiment_name: outside\n",
            "g/o.yaml": "experiment_name: outside\n",
            "conf/sub/x.yaml": "{}\n",
        },
    )
    assert f"outside the config directory {tmp_path / 'conf'}" in _error(path)


def test_absolute_entries_start_at_the_config_directory_as_in_hydra(tmp_path):
    """`/group@pkg: option` and `/name` are read from the primary file's directory, also from a
    file in a subdirectory; an absolute filesystem path is not read from the filesystem root."""
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text("trainer:\n  experiment_name: elsewhere\n")
    path = _tree(
        tmp_path / "t",
        {
            "conf/main.yaml": "defaults:\n  - sub/inner\n  - _self_\ntrainer:\n  project_name: p\n",
            "conf/sub/inner.yaml": "defaults:\n  - /names@trainer: one\n  - /top\n  - _self_\n",
            "conf/names/one.yaml": "experiment_name: from-the-root\n",
            "conf/top.yaml": "trainer:\n  seed: 7\n",
        },
    )
    cfg = load_config(path, check=False)
    assert cfg.trainer.experiment_name == "from-the-root" and cfg.trainer.seed == 7 and cfg.trainer.project_name == "p"
    (path.parent / "main.yaml").write_text(f"defaults:\n  - {outside.with_suffix('')}\n  - _self_\n")
    msg = _error(path)
    assert f"names {path.parent}{outside.with_suffix('.yaml')}, which does not exist" in msg
