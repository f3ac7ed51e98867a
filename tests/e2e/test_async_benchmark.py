"""benchmarks/async.py --smoke: the three modes run on CPU and the table's numbers follow from their metrics."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_async_benchmark_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/async.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "async.json").read_text())
    modes = result["modes"]
    assert list(modes) == ["sync", "one_step_off", "async"]
    assert [modes[m]["staleness_max"] for m in modes] == [0.0, 1.0, 2.0]  # 4 steps reach the bound of each
    # one_step_off: steps 1..4 train on staleness 0, 1, 1, 1; async (max 2): 0, 1, 2, 2
    assert modes["one_step_off"]["staleness_mean"] == pytest.approx(0.75)
    assert modes["async"]["staleness_mean"] == pytest.approx(1.25)
    for m in modes.values():
        assert m["steps"] == 4 and 0 < m["idle_share_trainer"] < 1 and 0 < m["idle_share_rollout"] < 1
        assert m["speedup_vs_sync"] == pytest.approx(modes["sync"]["step_s_median"] / m["step_s_median"])
    assert "one_step_off" in proc.stdout and "speed-up" in proc.stdout
