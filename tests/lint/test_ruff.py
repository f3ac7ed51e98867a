"""The tree is ruff-clean (lint and format, pyproject.toml's [tool.ruff]): CI runs this with the rest."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATHS = ["hybridrl", "tests", "benchmarks", "examples"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    if (
        shutil.which("ruff") is None
        and subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode
    ):
        pytest.fail("ruff is not installed: `pip install -e '.[test]'` installs it")
    return subprocess.run([sys.executable, "-m", "ruff", *args, *PATHS], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_ruff_lint_is_clean():
    proc = _ruff("check", "--no-cache")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_is_clean():
    proc = _ruff("format", "--check", "--no-cache")
    assert proc.returncode == 0, "run `ruff format hybridrl tests benchmarks examples`:\n" + proc.stdout[-4000:]
