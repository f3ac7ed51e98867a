"""A local Ray cluster started by a run does not outlive it: its files live in a temp dir of
their own, removed at exit, and SIGTERM stops the cluster's processes like a normal exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import sys, time
from types import SimpleNamespace as N
from hybridrl.distributed.ray_backend import init_ray
init_ray(N(ray_init=N(address=None, num_cpus=1, kwargs={}), trainer=N(nnodes=1, n_gpus_per_node=1)))
import ray
print("TEMP", ray._private.worker._global_node.get_temp_dir_path(), flush=True)
if sys.argv[1] == "wait":  # as a driver between steps: Python runs a signal's handler between bytecodes,
    for _ in range(6000):   # and a SIGTERM the kernel hands to one of Ray's threads waits for the main
        time.sleep(0.1)     # thread's next one (one sleep(600) made the test wait 120 s in CI on 2026-11-29)
"""


def _processes_using(path: str) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if path in cmd:
                out.append(f"{proc.name}: {cmd[:120]}")
    return out


def _gone(path: str, timeout: float = 60.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not os.path.exists(path) and not _processes_using(path):
            return True
        time.sleep(0.5)
    return False


@pytest.mark.parametrize("how", ["exit", "sigterm"])
def test_local_ray_cluster_is_removed_with_its_driver(how):
    pytest.importorskip("ray")
    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("joins an existing cluster: nothing local to clean up")
    err = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, "wait" if how == "sigterm" else "exit"],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("TEMP "), line
        temp = line.split()[1]
        assert os.path.isdir(temp) and "hybridrl-ray-" in temp
        if how == "sigterm":
            assert _processes_using(temp), "the local cluster's processes run from the run's temp dir"
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        err.seek(0)
        # ray.init's handlers are replaced by ours: Ray's core worker used to catch the SIGTERM,
        # dump a stack and end the process with SIGABRT (-6); now it exits 128 + 15, cleanly.
        assert code == (143 if how == "sigterm" else 0), code
        assert "SIGTERM received" not in err.read()
        assert _gone(temp), _processes_using(temp)
    finally:
        if proc.poll() is None:
            proc.kill()
