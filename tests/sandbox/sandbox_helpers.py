"""Helpers of the sandbox tests: hostile snippets' outcomes and what they leave behind."""

import json
import os

import pytest

from hybridrl.sandbox import namespaces_available
from hybridrl.sandbox.cgroup import cgroup_available


def sandbox_processes() -> int:
    """Processes of a sandbox (its setup, its PID 1, anything they started) still alive."""
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                n += b"hybridrl-sandbox-launcher" in f.read()
        except OSError:
            pass
    return n


def attempts(*lines: str) -> str:
    """A snippet that tries each `name: statement` and prints one JSON line {name: "done" | error class}."""
    body = ["import json, os, sys", "r = {}"]
    for line in lines:
        name, stmt = line.split(": ", 1)
        body += [
            "try:",
            f"    {stmt}",
            f"    r[{name!r}] = 'done'",
            "except BaseException as e:",
            f"    r[{name!r}] = type(e).__name__",
        ]
    return "\n".join(body + ["print(json.dumps(r))"])


def outcome(result) -> dict:
    assert result.exit_code == 0, result
    return json.loads(result.stdout.splitlines()[-1])


WHY_NOT = namespaces_available()


def require(why_not: str | None, what: str) -> None:
    """FAIL when this machine cannot `what` (a CI machine must), or skip with HYBRIDRL_ALLOW_NO_SANDBOX=1."""
    if why_not is None:
        return
    if os.environ.get("HYBRIDRL_ALLOW_NO_SANDBOX") == "1":
        pytest.skip(f"no sandbox on this machine (HYBRIDRL_ALLOW_NO_SANDBOX=1): {why_not}")
    pytest.fail(
        f"the code sandbox cannot {what} here ({why_not}); its security tests must run where it can. "
        f"Set HYBRIDRL_ALLOW_NO_SANDBOX=1 only on a machine known not to allow it."
    )


def require_isolation() -> None:
    require(WHY_NOT, "isolate (Linux user, mount, PID and network namespaces)")


def require_cgroup() -> None:
    require_isolation()
    require(cgroup_available(), "make a per-snippet cgroup (root, or a delegated cgroup)")


# Ten children, ten grandchildren each, all alive at once: counted by the forks that returned a pid (no sleeps).
FORK_TREE = """
import os
done_r, done_w = os.pipe()
release_r, release_w = os.pipe()

def fork():
    try:
        return os.fork()
    except Exception:
        return None

def hold():  # stay alive until the parent has counted
    os.read(release_r, 1)
    os._exit(0)

children = 0
for _ in range(10):
    pid = fork()
    if pid == 0:
        os.close(release_w)
        grandchildren = 0
        for _ in range(10):
            g = fork()
            if g == 0:
                hold()
            grandchildren += g is not None
        os.write(done_w, bytes([grandchildren]))
        hold()
    children += pid is not None
total = children + sum(os.read(done_r, 1)[0] for _ in range(children))
print(total)
"""
