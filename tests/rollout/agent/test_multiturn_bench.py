"""benchmarks/multiturn.py --tiny (CPU): the single-turn row and the multi-turn rows sample the
same number of model tokens, the multi-turn rows pause and rejoin through extend passes, and the
JSON has a row per (delay, wait)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_multiturn_benchmark_smoke(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "benchmarks/multiturn.py", "--tiny", "--repeats", "1", "--delays-ms", "0", "5", "--waits", "4"]
    subprocess.run([*cmd, "--out", str(tmp_path)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "multiturn_bench.json").read_text())
    rows = result["rows"]
    assert [(r["delay_ms"], r["wait"]) for r in rows] == [(0.0, None), (0.0, 0), (0.0, 4), (5.0, 0), (5.0, 4)]
    model_tokens = result["prompts"] * result["turns"] * result["turn_tokens"]
    assert all(r["model_tokens"] == model_tokens and r["tokens_per_s"] > 0 for r in rows)
    assert rows[0]["extend_passes"] == 0
    for r in rows[1:]:  # every row rejoined turns - 1 times, in one pass or several
        assert r["extend_passes"] >= 1
        assert r["extend_passes"] * r["extend_rows_mean"] == result["prompts"] * (result["turns"] - 1)
