"""benchmarks/scaling_table.py: the weak-scaling table of benchmarks/scaling.sh, built from canned
metrics.jsonl files with numbers worked out by hand (the script's CPU smoke run, SMOKE=1, takes
minutes on the 2-core CI machine; the table is what it ends with)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "scaling_table.py"


def _load():
    spec = importlib.util.spec_from_file_location("scaling_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, steps: list[dict]) -> None:
    rows = [{"step": 0, "val/score": 0.1}] + [{"step": i + 1, **s} for i, s in enumerate(steps)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def _step(step, gen, update, tokens, mfu=None, **more):
    row = {"timing_s/step": step, "timing_s/gen": gen, "timing_s/update_actor": update, "timing_s/ref": 0.5}
    row.update({"perf/total_num_tokens": tokens, **more})
    if mfu is not None:
        row["perf/mfu/actor"] = mfu
    return row


def test_table_of_medians_efficiency_and_mfu(tmp_path):
    # step 1 (warm-up) is ignored; the median of steps 2-4 is the middle value
    _write(
        tmp_path / "grpo_1gpu.jsonl", [_step(9.0, 5, 9, 1), _step(2.0, 1.0, 0.5, 8000, 0.40), _step(4.0, 1.2, 0.7, 8000, 0.38)]
    )
    _write(
        tmp_path / "grpo_2gpu.jsonl",
        [_step(9.0, 5, 9, 1), _step(2.5, 1.1, 0.9, 16000, 0.30), _step(2.5, 1.3, 0.8, 16000, 0.34), _step(3.0, 1.2, 1.0, 16000)],
    )
    table = _load().table(tmp_path, [1, 2])
    lines = table.splitlines()
    assert (
        lines[0]
        == "| run | GPUs | step s | gen | old log-prob | ref | update_actor | tokens/s per GPU | efficiency | MFU per GPU |"
    )
    # 1 GPU: median step (2 + 4) / 2 = 3.0 s, 8000 tokens / 3 s / 1 = 2,667 tokens/s; MFU median 39%
    assert lines[2] == "| GRPO colocated | 1 | 3.00 | 1.10 | - | 0.50 | 0.60 | 2,667 | 1.00 | 39.0% |"
    # 2 GPUs: median step 2.5 s, 16000 / 2.5 / 2 = 3,200 per GPU = 1.20 of one GPU's; MFU of the two steps that have it
    assert lines[3] == "| GRPO colocated | 2 | 2.50 | 1.20 | - | 0.50 | 0.90 | 3,200 | 1.20 | 32.0% |"


def test_ppo_rows_add_the_critic_columns_and_cpu_has_no_mfu(tmp_path):
    grpo = [_step(1.0, 0.5, 0.2, 100)] * 2
    gae = [_step(2.0, 0.5, 0.2, 100, **{"timing_s/values": 0.3, "timing_s/update_critic": 0.4})] * 2
    _write(tmp_path / "grpo_2gpu.jsonl", grpo)
    _write(tmp_path / "gae_colocated.jsonl", gae)
    _write(tmp_path / "gae_split.jsonl", gae)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "2", "--ppo", "4", "3"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[0].startswith("| run | GPUs | step s | gen | old log-prob | ref | values | update_critic | update_actor |")
    assert out[2] == "| GRPO colocated | 2 | 1.00 | 0.50 | - | 0.50 | - | - | 0.20 | 50 | 1.00 | - |"
    assert out[3] == "| PPO (gae) colocated | 4 | 2.00 | 0.50 | - | 0.50 | 0.30 | 0.40 | 0.20 | 12 |  | - |"
    assert out[4].startswith("| PPO (gae) split 3 + 1 | 4 |")


def test_a_run_of_one_step_says_so(tmp_path):
    _write(tmp_path / "grpo_1gpu.jsonl", [_step(1.0, 0.5, 0.2, 100)])
    with pytest.raises(SystemExit, match="no step 2 or later"):
        _load().table(tmp_path, [1])


def test_mode_table_compares_off_policy_runs_with_sync_at_equal_gpus(tmp_path):
    score = {"critic/score/mean": 0.5}
    # sync on 2 GPUs: 8000 tokens in 4 s -> 1,000 tokens/s per GPU; the trainer waits for gen (2 of 4 s),
    # the colocated engine for the rest (2 of 4 s)
    _write(tmp_path / "grpo_2gpu.jsonl", [_step(9.0, 5, 1, 1, **score)] + [_step(4.0, 2.0, 1.5, 8000, **score)] * 2)
    # one_step_off, rollout pool of 1: 8000 tokens in 2.5 s -> 1,600 per GPU = 1.60 of sync; the trainer waited
    # 0.5 s of each 2.5 s step (20%), the pool 1.0 s idle for each 1.5 s generate (40%); staleness 1
    off = {"async/idle_s/trainer": 0.5, "async/idle_s/rollout": 1.0, "rollout_pool/generate_s": 1.5}
    off.update({"async/staleness_mean": 1.0, "async/staleness_max": 1.0, **score})
    _write(tmp_path / "one_step_off_2gpu_r1.jsonl", [_step(9.0, 5, 1, 1, **off)] + [_step(2.5, 0.5, 1.5, 8000, **off)] * 2)
    lines = _load().mode_table(tmp_path, [2], ["sync", "one_step_off", "async"]).splitlines()
    assert lines[0] == (
        "| mode | GPUs | rollout pool | step s | tokens/s per GPU | relative to sync | staleness mean / max "
        "| trainer idle | rollout idle |"
    )
    assert lines[2] == "| sync | 2 | - | 4.00 | 1,000 | 1.00 | 0.00 / 0 | 50.0% | 50.0% |"
    assert lines[3] == "| one_step_off | 2 | 1 | 2.50 | 1,600 | 1.60 | 1.00 / 1 | 20.0% | 40.0% |"
    assert len(lines) == 4  # no async run there: no row
    assert _load().mode_table(tmp_path, [2], ["sync"]) is None  # sync alone: the first table says it all


def test_baseline_from_another_directory(tmp_path):
    # a variant measured on 2 GPUs only, its efficiency against the 1-GPU row of another OUT_DIR
    (tmp_path / "base").mkdir()
    (tmp_path / "variant").mkdir()
    _write(tmp_path / "base" / "grpo_1gpu.jsonl", [_step(9.0, 5, 9, 1), _step(2.0, 1.0, 0.5, 8000)])
    _write(tmp_path / "variant" / "grpo_2gpu.jsonl", [_step(9.0, 5, 9, 1), _step(2.5, 1.0, 0.5, 18000)])
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "variant"), "2", "--baseline", str(tmp_path / "base" / "grpo_1gpu.jsonl")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[2].startswith("| GRPO colocated, baseline base/grpo_1gpu.jsonl | 1 | 2.00 |")
    assert out[2].endswith("| 4,000 | 1.00 | - |")
    # 18000 / 2.5 / 2 = 3,600 per GPU = 0.90 of the baseline's 4,000
    assert out[3] == "| GRPO colocated | 2 | 2.50 | 1.00 | - | 0.50 | 0.50 | 3,600 | 0.90 | - |"
    missing = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "variant"), "2", "--baseline", str(tmp_path / "nope_1gpu.jsonl")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "no such file" in missing.stderr
