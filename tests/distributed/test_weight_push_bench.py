"""benchmarks/weight_push.py in its CPU smoke mode (gloo, 2 FSDP2 trainer ranks, 1 rollout rank):
it runs the project's push end to end, and its numbers are consistent."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_weight_push_benchmark_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/weight_push.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "weight_push.json").read_text())
    assert (result["trainer_ranks"], result["rollout_ranks"], result["pushes"]) == (2, 1, 3)
    assert [(row["model"], row["staging"]) for row in result["rows"]] == [("tiny", "host"), ("tiny", "device")]  # the A/B
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from transformers import AutoModelForCausalLM
    from weight_push import _config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config("tiny"))
    for row in result["rows"]:
        assert row["bytes"] == 4 * sum(p.numel() for p in model.parameters())  # the whole policy in fp32 (CPU), each push
        for kind in ("plain", "verified"):
            t = row[kind]
            # the trainer is blocked while it gathers and stages; the rollout rank has loaded only after that
            assert 0 < t["blocked_ms"] <= t["stream_ms"] <= t["sent_ms"] and t["blocked_ms"] <= t["push_ms"] < 60_000, t
        assert row["plain"]["checked"] == 0 and row["verified"]["checked"] == 3  # each verified push checked out
        assert row["verified"]["sender_checksum_ms"] > 0 and row["verified"]["receiver_checksum_ms"] > 0
        assert row["push_gb_per_s"] > 0
    assert "| tiny | host |" in proc.stdout and "| tiny | device |" in proc.stdout
