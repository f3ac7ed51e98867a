"""benchmarks/rollout.py and benchmarks/decode_host.py in their CPU smoke modes: they run, and the
numbers they report add up."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, out: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--tiny", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_decode_host_parts_add_up_to_the_engines_step_time(tmp_path):
    out = _run("decode_host.py", tmp_path, "--steps", "1", "2")
    rows = json.loads((tmp_path / "decode_host.json").read_text())["rows"]
    assert [(r["layout"], r["steps"]) for r in rows] == [("aligned", 1), ("ragged", 1), ("aligned", 2), ("ragged", 2)]
    for r in rows:
        parts = [r["launch_host_ms"], r["replay_call_ms"], r["wait_ms"], r["collect_host_ms"]]
        assert all(p >= 0 for p in parts) and r["wall_ms"] > 0
        # the engine times each launch and the collection of the step before it: the same span
        assert sum(parts) == pytest.approx(r["wall_ms"], rel=0.1)
        assert len(r["halves_ms"]) == 2 and all(h > 0 for h in r["halves_ms"])
    assert "| ragged | 2 |" in out


def test_rollout_benchmark_reports_every_row(tmp_path):
    out = _run("rollout.py", tmp_path, "--no-hf")
    result = json.loads((tmp_path / "rollout_bench.json").read_text())
    assert [(r["model"], r["prompts"]) for r in result["rows"]] == [("tiny", 4), ("tiny", 8)]
    for r in result["rows"]:
        n = r["native"]
        assert n["tokens_per_s"] > 0 and n["decode_ms"] > 0
        assert n["tokens_per_s"] == pytest.approx(r["prompts"] * result["new_tokens"] / n["wall_s"])
    assert result["switch"]["tiny"] > 0
    assert "| tiny | 8 |" in out


def test_prefill_features_benchmark_compares_each_feature_with_it_off(tmp_path):
    out = _run("prefill_features.py", tmp_path)
    rows = json.loads((tmp_path / "prefill_features.json").read_text())["rows"]
    prefix = [r for r in rows if r["feature"] == "prefix_caching"]
    assert [(r["new_tokens"], r["on"]) for r in prefix] == [(1, False), (1, True), (8, False), (8, True)]
    for r in prefix:
        assert r["seconds"] > 0 and r["same_responses"] == 1.0  # float32 on CPU: the same samples
        # 4 prompts of 32 shared + 8 own tokens, 16-token blocks: the 3 later ones share 2 blocks each
        assert r["hit_rate"] == (pytest.approx(3 * 32 / (4 * 40)) if r["on"] else 0.0)
    chunked = [r for r in rows if r["feature"] == "chunked_prefill"]
    assert [r["on"] for r in chunked] == [False, True]
    assert chunked[0]["prefill_chunks"] == 0 and chunked[1]["prefill_chunks"] >= 64 // 16  # the long prompt, in chunks
    assert all(r["max_launch_gap_ms"] > 0 and r["same_responses"] == 1.0 for r in chunked)
    assert "chunked prefill on" in out and "prefix caching on" in out


def test_prefill_backends_arms_draw_the_same_tokens_on_cpu(tmp_path):
    """benchmarks/lab/prefill_backends.py: both arms run the same prompts with the same seeds; on CPU
    (no cuDNN) the backend lists pick the same kernel, so the tokens agree and the times are real."""
    _run("lab/prefill_backends.py", tmp_path)
    rows = json.loads((tmp_path / "prefill_backends.json").read_text())["rows"]
    assert len(rows) == 2
    assert len({r["tokens_sha256"] for r in rows.values()}) == 1
    assert all(0 < r["prefill_s"] <= r["wall_s"] for r in rows.values())
