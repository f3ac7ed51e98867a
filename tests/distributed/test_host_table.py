"""benchmarks/host_table.py (issue 49): the step table and the per-method GPU-busy / host table of
benchmarks/host_overhead.sh's runs, on canned run folders with numbers worked out by hand."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("host_table", ROOT / "benchmarks" / "host_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(out: Path, name: str, steps: list[float], update_wall: float, idle: float):
    d = out / name
    d.mkdir(parents=True)
    rows = [
        {
            "step": i + 1,
            "timing_s/step": s,
            "timing_s/gen": 0.5,
            "timing_s/ref": 0.1,
            "timing_s/update_actor": s - 0.6,
            "perf/total_num_tokens": 80_000,
            "perf/mfu/actor": 0.3,
        }
        for i, s in enumerate(steps)
    ]
    (d / "grpo_1gpu.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    device = {
        "update_actor": {
            "wall": update_wall,
            "compute": update_wall - idle,
            "comm": 0.0,
            "exposed_comm": 0.0,
            "idle": idle,
            "calls": 1,
        }
    }
    host = {
        "update_actor": {
            "wall": update_wall,
            "python": 100.0,
            "sync": 20.0,
            "launch": 10.0,
            "ops": 50.0,
            "launches": 3,
            "top": [["aten::copy_", 30.0], ["aten::mm", 20.0]],
        }
    }
    (d / "grpo_1gpu.trace.json").write_text(json.dumps({"device": {"actor_rank0": device}, "host": {"actor_rank0": host}}))


def test_tables_give_medians_busy_shares_and_host_splits(tmp_path):
    ht = _load()
    _run(tmp_path, "threads-1_n8c", [30.0, 3.0, 3.4, 3.2], update_wall=1200.0, idle=960.0)
    _run(tmp_path, "threads0_n0c", [20.0, 1.0, 1.1, 1.05], update_wall=250.0, idle=25.0)
    (tmp_path / "not_a_run").mkdir()
    steps = ht.step_table(tmp_path).splitlines()
    assert len(steps) == 4  # header, rule, two runs
    assert steps[2].startswith("| cpu_threads torch default, 8 CPU neighbours | 3.200 |")  # median of steps 2-4
    assert "| cpu_threads auto, alone | 1.050 |" in steps[3]
    assert "| 76,190 | 30.0% |" in steps[3]  # 80,000 tokens / 1.05 s
    trace = ht.trace_table(tmp_path).splitlines()
    assert "| update_actor | 1200 | 20% | 100 | 50 | 10 | 20 | aten::copy_ 30, aten::mm 20 |" in trace[2]
    assert "| update_actor | 250 | 90% |" in trace[3]


def test_an_empty_folder_says_what_to_run(tmp_path):
    with pytest.raises(SystemExit, match="host_overhead.sh"):
        _load().runs(tmp_path)


def test_the_profiled_step_is_left_out_of_the_medians(tmp_path):
    ht = _load()
    _run(tmp_path, "threads0_n0c", [20.0, 1.0, 1.2, 11.0, 0.9], update_wall=250.0, idle=25.0)
    assert "| cpu_threads auto, alone | 1.100 |" in ht.step_table(tmp_path)  # steps 2-5: 1.0, 1.2, 11.0, 0.9
    assert "| cpu_threads auto, alone | 1.000 |" in ht.step_table(tmp_path, skip_step=4)  # 1.0, 1.2, 0.9
