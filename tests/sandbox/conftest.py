"""The sandbox tests' fixtures: `run` (a snippet through a fresh LocalSandbox; the test FAILS where the
kernel cannot isolate, unless HYBRIDRL_ALLOW_NO_SANDBOX=1) and `hook` (the audit hook on and off)."""

import asyncio
import sys
from pathlib import Path

import pytest

from hybridrl.sandbox import LocalSandbox, SandboxConfig
from hybridrl.sandbox import local as sandbox_module

sys.path.insert(0, str(Path(__file__).parent))  # sandbox_helpers by name (--import-mode=importlib)
from sandbox_helpers import require_isolation  # noqa: E402


@pytest.fixture
def run():
    require_isolation()

    def run_(code, **config):
        config.setdefault("wall_timeout_s", 5.0)
        return asyncio.run(LocalSandbox(SandboxConfig(**config)).run(code))

    return run_


@pytest.fixture(params=[True, False], ids=["with-hook", "kernel-only"])
def hook(request, monkeypatch):
    """Each escape runs with the audit hook (as shipped) and without it: the kernel must hold alone."""
    monkeypatch.setattr(sandbox_module, "_AUDIT_HOOK", request.param)
    return request.param
