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
    dumps = out.stderr.count("Timeout (0:00:00.300000)!")
    assert 2 <= dumps <= 6, out.stderr
    assert out.stderr.count("in waiting_in_a_collective") >= dumps - 1  # a last dump may come after the thread ended
    assert "Thread" in out.stderr


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
