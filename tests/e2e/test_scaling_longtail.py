"""benchmarks/scaling.sh's long-tail workload on CPU (SMOKE=1 WORKLOAD=longtail): sync and one_step_off
train on the same forced response lengths step by step, and the script ends with both tables."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def _lengths(path: Path) -> list[tuple]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    keys = ("response_length/mean", "response_length/max", "response_length/min", "perf/total_num_tokens")
    return [tuple(r[k] for k in keys) for r in rows if "response_length/mean" in r]


def test_longtail_smoke_sync_and_one_step_off_see_the_same_workload(tmp_path):
    gsm8k = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {i} + {i + 3}?", "answer": f"{i}+{i + 3}={2 * i + 3}\n#### {2 * i + 3}"} for i in range(8)]
    gsm8k.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "SMOKE": "1", "WORKLOAD": "longtail", "MODES": "sync one_step_off", "STEPS": "3"}
    proc = subprocess.run(
        ["bash", "benchmarks/scaling.sh", str(gsm8k), str(tmp_path / "out"), "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    sync, off = _lengths(out / "grpo_1gpu.jsonl"), _lengths(out / "one_step_off_1gpu_r0.jsonl")
    assert len(sync) == 3 and sync == off  # each step's responses: the same lengths in both modes
    assert all(mx <= 24 for _, mx, _, _ in sync)  # RESP=24 in the smoke run: the cap
    assert len({mean for mean, _, _, _ in sync}) == 3 and any(mx > mn for _, mx, mn, _ in sync)  # drawn, not fixed
    config = (out / "runs" / "grpo_1gpu" / "config.yaml").read_text()
    assert "forced_response_lengths: {distribution: lognormal, median: 6.0, sigma: 1.0" in config
    assert "| sync | 1 | - |" in proc.stdout and "| one_step_off | 1 | colocated |" in proc.stdout


def test_unknown_workload_or_mode_is_refused(tmp_path):
    for env, message in (({"WORKLOAD": "short"}, "WORKLOAD=short: one of gsm8k, longtail"), ({"MODES": "sync fast"}, "fast")):
        proc = subprocess.run(
            ["bash", "benchmarks/scaling.sh", "g.jsonl", str(tmp_path)],
            cwd=ROOT,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and message in proc.stderr
