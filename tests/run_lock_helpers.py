"""A live run's lock held by another process, for the tests of one run per directory
(tests/trainer/test_run_dir.py, tests/api/test_api_inputs.py)."""

from __future__ import annotations

import subprocess
import sys

_HOLD = """
import sys, time
from pathlib import Path
from hybridrl.trainer import rundir
with rundir.locked(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def hold_lock(path) -> subprocess.Popen:
    """A process holding `path`'s run lock (as a training run does) until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc
