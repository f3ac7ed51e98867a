"""benchmarks/shared_prompts.py --tiny (CPU): every pass is timed both ways, the shared layout
computes (n - 1) fewer copies of each prompt, and the two ways' log-probs agree."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_shared_prompts_benchmark_smoke(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "benchmarks/shared_prompts.py", "--tiny", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "shared_prompts.json").read_text())
    (row,) = result["rows"]
    assert set(row["passes"]) == {"update_actor", "old_log_prob", "ref"}
    assert all(v["unshared_s"] > 0 and v["shared_s"] > 0 for v in row["passes"].values())
    t = row["tokens"]
    assert 0 < t["shared"] < t["unshared"]
    assert row["max_abs_log_prob_diff"] < 1e-4
