"""benchmarks/spec_tail.py: the replay of speculative decoding, checked by hand on a toy rollout,
and its CPU smoke run (a tiny model's rollout, replayed at three draft lengths)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from spec_tail import replay, spec_steps  # noqa: E402


def test_spec_steps_by_hand():
    # step 1: no earlier occurrence of any suffix, the verification samples "1";
    # step 2: suffix (1) was seen at the start -> draft 2 3 1, all kept, plus the sampled "2";
    # step 3: suffix (3 1 2) seen before -> draft 3 1 2, kept, and the response ends
    assert spec_steps([1, 2, 3], [1, 2, 3, 1, 2, 3, 1, 2, 3], k=4, ngram=3) == (3, 6)
    # a draft that diverges keeps only its matching prefix: draft 2 3 1 against 2 9 ...
    assert spec_steps([1, 2, 3], [1, 2, 9, 9], k=4, ngram=3) == (3, 1)
    # draft length 1 can keep one token a step at most
    steps, accepted = spec_steps([1, 2, 3], [1, 2, 3, 1, 2, 3, 1, 2, 3], k=1, ngram=3)
    assert accepted <= steps and steps >= 9 / 2
    assert spec_steps([5], [], k=4, ngram=3) == (0, 0)


def test_replay_reports_the_longest_row():
    r = replay([[1, 2, 3], [7]], [[1, 2, 3, 1, 2, 3, 1, 2, 3], [8, 6]], k=4, ngram=3)
    assert r["batch_steps_plain"] == 9 and r["batch_steps_spec"] == 3
    assert r["long_rows"] == 1 and r["long_rows_spec_steps"] == [3]
    assert r["positions_plain"] == 11 and r["positions_spec"] == (3 + 2) * 5


def test_spec_tail_smoke(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "benchmarks/spec_tail.py", "--tiny", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    rollout = json.loads((tmp_path / "rollout.json").read_text())
    assert len(rollout["responses"]) == 8 and all(len(r) <= 16 for r in rollout["responses"])
    summary = json.loads((tmp_path / "spec_tail.json").read_text())["summary"]
    assert [s["draft"] for s in summary] == [2, 4, 8]
    for s in summary:  # speculation never needs more steps than plain decoding
        assert 1 <= s["batch_steps_spec"] <= s["batch_steps_plain"] == max(len(r) for r in rollout["responses"])
