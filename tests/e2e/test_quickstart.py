"""The README's quickstart, run as shipped: the reward must clearly rise (the promise it makes), and
every deterministic metric must equal the stored run's (tests/e2e/golden/quickstart.jsonl)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from golden_metrics import GOLDEN_ENV, assert_matches_golden

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_reward_rises_and_matches_golden_metrics(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridrl",
            "train",
            "configs/quickstart.yaml",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.logger=[console,jsonl]",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **GOLDEN_ENV},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    scores = [r["critic/score/mean"] for r in rows if "critic/score/mean" in r]
    k = max(1, len(scores) // 10)
    first, last = sum(scores[:k]) / k, sum(scores[-k:]) / k
    assert last - first >= 0.2, f"reward rose only {first:.3f} -> {last:.3f}"  # measured +0.386 (golden run)
    val = [r["val-core/arith/reward/mean@1"] for r in rows if "val-core/arith/reward/mean@1" in r]
    assert val[-1] > val[0], f"held-out greedy accuracy did not improve: {val}"
    # The refactors of issue 14 (engine, loop, layout) must leave every number of the run unchanged.
    assert_matches_golden("quickstart", rows)
