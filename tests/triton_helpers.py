"""Shared by the Triton kernel tests (`tests/rollout/test_native_kernels.py`,
`tests/models/test_logprob_kernels.py`).

Triton reads TRITON_INTERPRET when it is imported, so on a CPU-only machine a file's kernel tests
(named `test_triton_*`) run in a child pytest with the variable set, and compare the kernels on
CPU tensors with the torch references; on a GPU machine they run directly on CUDA tensors."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KDEV = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"  # where the kernels run
RUN_INTERPRETED = pytest.mark.skipif(INTERPRETED or torch.cuda.is_available(), reason="the kernel tests run directly here")


def require_triton() -> None:
    """The test extra installs triton on Linux: there a missing triton is a broken install, and the
    kernel tests fail rather than skip (a skip would hide that they never ran)."""
    if importlib.util.find_spec("triton") is not None:
        return
    if sys.platform.startswith("linux"):
        pytest.fail("triton is not installed: `pip install -e '.[test]'` installs it (the kernel tests need it)")
    pytest.skip("triton is available on Linux only")


def require_kernels() -> None:
    """In a kernel test: triton present, and either the interpreter or a GPU to run on."""
    require_triton()
    if not (INTERPRETED or torch.cuda.is_available()):
        pytest.skip("run by test_kernels_under_the_triton_interpreter")


def run_interpreted(test_file: str, passed: int) -> None:
    """Run `test_file`'s `test_triton_*` tests in a child pytest under the Triton interpreter and
    require exactly `passed` of them to pass (none silently skipped or deselected)."""
    require_triton()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-vv", "-p", "no:cacheprovider", test_file, "-k", "test_triton_"],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.count("PASSED") == passed, proc.stdout[-3000:]
