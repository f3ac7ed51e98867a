"""HYBRIDRL_DUMP_STACKS_S: a hung process writes every thread's stack to stderr, periodically."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

HANGS = """
import threading, time
from hybridrl.distributed.hang_dump import dump_stacks_if_asked
assert dump_stacks_if_asked() == 0.3
def waiting_in_a_collective():
    time.sleep(1.2)
t = threading.Thread(target=waiting_in_a_collective); t.start(); t.join()
"""


def _run(code: str, value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDRL_DUMP_STACKS_S"}
    if value is not None:
        env["HYBRIDRL_DUMP_STACKS_S"] = value
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)


def test_the_stacks_of_every_thread_every_period():
    out = _run(HANGS, "0.3")
    assert out.returncode == 0, out.stderr
    # 1.2 s of waiting, a dump every 0.3 s: about 4 dumps, each naming the function the thread waits in
    dumps = out.stderr.count("[hybridrl] stacks of every thread")
    assert 2 <= dumps <= 6, out.stderr
    assert out.stderr.count("in waiting_in_a_collective") >= dumps - 1  # a last dump may come after the thread ended
    assert out.stderr.count("(MainThread)") == dumps and "HYBRIDRL_DUMP_STACKS_S=0.3" in out.stderr
    assert "hybridrl-dump-stacks" not in out.stderr  # the dumping thread leaves itself out


CHURN = """
import threading, time
from hybridrl.distributed.hang_dump import dump_stacks_if_asked
dump_stacks_if_asked()
end = time.monotonic() + 2.0
while time.monotonic() < end:  # threads that end while the stacks are read
    ts = [threading.Thread(target=time.sleep, args=(0.001,)) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
"""


def test_threads_that_end_during_a_dump_do_not_crash_the_process():
    """Two seconds of thread churn under a dump every millisecond: a thread that ended between
    `sys._current_frames()` and `threading.enumerate()` must not stop the dumps. (faulthandler's
    watchdog, used here before, walks the threads without the GIL, and a thread ending during its dump
    can crash the process: CPython issue 116008, and one SIGSEGV of the test above on 2026-11-29. This
    churn did not reproduce that crash in 5 runs of the old code, so it guards the new dumper only.)"""
    out = _run(CHURN, "0.001")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("[hybridrl] stacks of every thread") > 50


def test_unset_is_off():
    out = _run("from hybridrl.distributed.hang_dump import dump_stacks_if_asked\nassert dump_stacks_if_asked() is None", None)
    assert out.returncode == 0 and out.stderr == ""


@pytest.mark.parametrize("bad", ["soon", "0", "-5", "inf", "nan"])
def test_a_bad_period_is_one_line_from_the_cli(bad):
    env = {**os.environ, "HYBRIDRL_DUMP_STACKS_S": bad, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "hybridrl", "train", str(ROOT / "configs/quickstart.yaml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"hybridrl: error: HYBRIDRL_DUMP_STACKS_S={bad!r}: a period in seconds > 0, e.g. HYBRIDRL_DUMP_STACKS_S=120"
    ]
