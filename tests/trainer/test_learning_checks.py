"""benchmarks/learning_checks.py (the GPU gate's learning checks and the learning table's collapse column)
and benchmarks/learning_table.py's row, on canned metrics.jsonl and eval files with numbers worked out
by hand: the gate's runs are minutes on a GPU, the checks are what they end with."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FMT, VF, IMP, SCORE = "reward/gsm8k_format/mean", "critic/vf_loss", "rollout/improbable_token_frac", "critic/score/mean"


sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import each other from there
import learning_checks as LC  # noqa: E402
import learning_table as LT  # noqa: E402


def _steps(**series) -> list[dict]:
    """One row per step from per-key lists, 2.0 s a step."""
    n = max(len(v) for v in series.values())
    return [{"step": i + 1, "timing_s/step": 2.0, **{k: v[i] for k, v in series.items() if i < len(v)}} for i in range(n)]


def _write(path: Path, steps: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in [{"step": 0, "val/score": 0.1}, *steps]) + "\n")
    return path


RISING = [0.0, 0.03, 0.03, 0.1, 0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.9, 1.0]  # first 3: 0.02, last 5: 0.86


def test_format_rises_compares_the_first_3_and_last_5_steps():
    c = LC.format_rises(_steps(**{FMT: RISING}))
    assert c.passed and c.value == "0.020 -> 0.860"
    flat = LC.format_rises(_steps(**{FMT: [0.1] * 6 + [0.2] * 6}))  # 0.1 -> 0.2: a gain of 0.1 < 0.15
    assert not flat.passed and flat.value == "0.100 -> 0.200"
    short = LC.format_rises(_steps(**{FMT: RISING[:7]}))  # the windows would overlap
    assert not short.passed and short.value == f"7 steps log {FMT}; the check needs 8"


def test_value_loss_falls_or_not():
    falling = LC.value_loss_falls(_steps(**{VF: [0.09, 0.06, 0.03, 0.02, 0.02, 0.01, 0.01, 0.01, 0.012]}))
    assert falling.passed and falling.value == "0.06 -> 0.0124"
    rising = LC.value_loss_falls(_steps(**{VF: [0.01, 0.01, 0.01, 0.05, 0.06, 0.07, 0.08, 0.09]}))
    assert not rising.passed and rising.value == "0.01 -> 0.07"
    assert not LC.value_loss_falls(_steps(**{FMT: RISING})).passed  # a run without a critic


def test_improbable_tokens_on_every_step():
    assert LC.improbable_under(_steps(**{IMP: [2e-4, 1e-4, 9.9e-4]})).passed
    one_step = LC.improbable_under(_steps(**{IMP: [2e-4, 1.5e-3, 1e-4]}))
    assert not one_step.passed and one_step.value == "max 1.50e-03"
    missing = LC.improbable_under(_steps(**{FMT: RISING}))
    assert not missing.passed and missing.value == f"no step logs {IMP}"


def test_collapse_is_a_format_rate_that_fell_or_improbable_tokens():
    learned_and_lost = RISING + [0.9, 0.6, 0.5, 0.5, 0.4]  # best 5 in a row: (0.8+0.9+0.9+1+0.9)/5 = 0.9, last 5: 0.58
    assert LC.collapse(_steps(**{FMT: learned_and_lost})) == (True, "format rate fell (best 0.900, last 0.580)")
    assert LC.collapse(_steps(**{FMT: RISING, IMP: [1e-4] * 12})) == (False, "no")
    assert LC.collapse(_steps(**{FMT: RISING, IMP: [1e-4] * 11 + [2e-3]})) == (True, "improbable-token share max 2.00e-03")
    assert LC.collapse(_steps(**{FMT: [0.5, 0.5]})) == (False, "no")  # two steps: one window, its own best
    # best 5 in a row (0.8+0.9+0.9+1+0.78)/5 = 0.876: 0.78 is 0.096 below it, 0.70 is 0.16 below 0.86
    assert LC.collapse(_steps(**{FMT: RISING + [0.78] * 5})) == (False, "no")
    assert LC.collapse(_steps(**{FMT: RISING + [0.7] * 5})) == (True, "format rate fell (best 0.860, last 0.700)")


def _gate_out(tmp_path: Path, vf: list[float]) -> Path:
    out = tmp_path / "gate"
    _write(out / "run" / "metrics.jsonl", _steps(**{FMT: RISING, IMP: [1e-4] * 12, SCORE: RISING}))
    _write(out / "run_ppo" / "metrics.jsonl", _steps(**{FMT: RISING, IMP: [1e-4] * 12, VF: vf}))
    return out


def test_the_gate_passes_when_both_runs_learn(tmp_path, capsys):
    out = _gate_out(tmp_path, [0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.03, 0.02, 0.02, 0.02, 0.02, 0.02])
    assert LC.main(["gate", str(out), "--tests-s", "300", "--grpo-s", "70", "--ppo-s", "90"]) == 0
    table = (out / "gate.md").read_text()
    assert table == capsys.readouterr().out
    assert "| GPU tests | passed (300 s) |" in table and "| PPO learning run | 12 steps in 90 s |" in table
    assert "| PPO `critic/vf_loss` first 3 -> last 5 | 0.08 -> 0.02 |" in table
    assert "| GRPO `critic/score/mean` first 3 -> last 5 | 0.020 -> 0.860 |" in table
    assert table.count("| PASS (") == 4 and "FAIL" not in table


def test_the_gate_reports_ppos_format_rate_without_checking_it(tmp_path, capsys):
    # 16 steps of verl's quickstart PPO do not move the format rate (H200, 2026-11-29): a flat PPO rate
    # with a falling value loss passes; the rate is still in the table.
    out = _gate_out(tmp_path, [0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.03, 0.02, 0.02, 0.02, 0.02, 0.02])
    _write(out / "run_ppo" / "metrics.jsonl", _steps(**{FMT: [0.014] * 12, IMP: [1e-4] * 12, VF: [0.1] * 3 + [0.01] * 9}))
    assert LC.main(["gate", str(out), "--tests-s", "1", "--grpo-s", "1", "--ppo-s", "1"]) == 0
    table = capsys.readouterr().out
    assert "| PPO `reward/gsm8k_format/mean` first 3 -> last 5 steps | 0.014 -> 0.014 |" in table
    assert "PPO: format rate" not in table and "FAIL" not in table
    _write(out / "run" / "metrics.jsonl", _steps(**{FMT: [0.02] * 12, IMP: [1e-4] * 12}))  # GRPO's still is
    assert LC.main(["gate", str(out), "--tests-s", "1", "--grpo-s", "1", "--ppo-s", "1"]) == 1


def test_the_gate_fails_when_the_critic_learns_nothing(tmp_path, capsys):
    out = _gate_out(tmp_path, [0.02] * 3 + [0.03] * 9)
    assert LC.main(["gate", str(out), "--tests-s", "1", "--grpo-s", "1", "--ppo-s", "1"]) == 1
    assert "| PPO: value loss falls (mean of the last 5 steps < first 3) | FAIL (0.02 -> 0.03) |" in capsys.readouterr().out
    (out / "run_ppo" / "metrics.jsonl").unlink()
    assert LC.main(["gate", str(out), "--tests-s", "1", "--grpo-s", "1", "--ppo-s", "1"]) == 2
    assert "run_ppo/metrics.jsonl does not exist" in capsys.readouterr().err


def _eval_files(out: Path, which: str, responses: list[str], accuracy: float, flexible: float) -> None:
    rows = [{"response": r, "ground_truth": "72", "score": float(r.endswith("#### 72"))} for r in responses]
    (out / f"eval_{which}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"openai/gsm8k": {"n": len(rows), "accuracy": accuracy, "correct": 1, "flexible_accuracy": flexible}}
    (out / f"eval_{which}.json").write_text(json.dumps({**summary, "rollout": {"perf/rollout_tokens_per_s": 1.0}}))


def test_the_row_from_a_run_and_its_evals(tmp_path, capsys):
    out = tmp_path / "row"
    steps = _steps(**{FMT: RISING, SCORE: [0.1, 0.2, 0.3, 0.1, 0.5, 0.5, 0.5, 0.6, 0.6, 0.7, 0.7, 0.9], IMP: [3e-4] + [1e-4] * 11,
                      "reward/gsm8k_strict_acc/mean": [0.0] * 12})  # fmt: skip
    _write(out / "run" / "metrics.jsonl", steps)
    (out / "run" / "config.yaml").write_text(
        "actor_rollout_ref: {model: {path: /models/Qwen2.5-Coder-0.5B-Instruct}}\n"
        "trainer: {max_wall_time_s: 540.0, mode: async, n_gpus_per_node: 4, nnodes: 1}\n"
        "resource_pool: {rollout: 2}\nasync_training: {partial_rollout: true}\n"
    )
    (out / "run" / "run_summary.json").write_text(json.dumps({"wall_time_s": 551.5}))
    (out / "model_dir").write_text("/models/Qwen2.5-Coder-0.5B-Instruct\n")
    _eval_files(out, "after", ["so 72. #### 72", "#### 71", "it is 72", "60 + 12 = 72 #### 72"], 0.5, 0.75)
    _eval_files(out, "before", ["it is 72", "72", "71", "#### 72"], 0.25, 0.5)
    rows = LT.write_row("grpo", out)
    base, row = rows
    assert base["recipe"] == "grpo (base model)" and base["model"] == "Qwen2.5-Coder-0.5B-Instruct"
    assert (base["strict"], base["flexible"], base["format_rate"], base["n_eval"]) == (0.25, 0.5, 0.25, 4)
    assert row["model"] == "Qwen2.5-Coder-0.5B-Instruct" and row["mode"] == "async (partial), 2 rollout GPU(s)"
    assert (row["gpus"], row["budget_s"], row["wall_s"], row["steps"], row["train_s"]) == (4, 540.0, 551.5, 12, 24.0)
    assert (row["strict"], row["flexible"], row["format_rate"], row["n_eval"]) == (0.5, 0.75, 0.75, 4)
    assert row["reward_first"] == pytest.approx(0.2) and row["reward_last"] == pytest.approx(
        0.7
    )  # (.1+.2+.3)/3, (.6+.6+.7+.7+.9)/5
    assert (row["improbable_max"], row["collapsed"], row["collapse"]) == (3e-4, False, "no")
    printed = capsys.readouterr().out
    line = ("| grpo | Qwen2.5-Coder-0.5B-Instruct | async (partial), 2 rollout GPU(s) | 4 | 540 | 12 | 50.0% | 75.0% | 75.0% "
            "| 0.200 -> 0.700 | 3.0e-04 | no |")  # fmt: skip
    assert line in printed and (out / "results" / "row.md").read_text().splitlines()[-1] == line
    assert json.loads((out / "results" / "row.json").read_text()) == rows
    # the run in windows of 25 steps (learning_diagnose.py): here one window, steps 1-12, 24 s
    window = (out / "results" / "windows.md").read_text().splitlines()[2]
    assert [c.strip() for c in window.strip("|").split("|")][:3] == ["1-12", "24", "0.000"]
    for f in ("metrics.jsonl", "config.yaml", "run_summary.json", "eval_after.json", "eval_after.jsonl", "eval_before.json"):
        assert (out / "results" / f).is_file(), f
    svg = ET.parse(out / "results" / "reward_vs_time.svg").getroot()
    lines = svg.findall("{http://www.w3.org/2000/svg}polyline")
    assert [p.find("{http://www.w3.org/2000/svg}title").text for p in lines] == [
        "reward (critic/score/mean)",
        "`####` rate of the samples",
        "strict accuracy of the samples",
    ]
    assert all(len(p.get("points").split()) == 12 for p in lines)
    # x: 2 s a step, 24 s in all, on an axis of 0..30 (ticks every 10 s) from pixel 70 to 700: the first
    # point, at 2 s, is at 70 + 630 * 2 / 30 = 112; y: 0.1 on 0..1, pixels 350 (0) to 40 (1): 319
    assert lines[0].get("points").split()[0] == "112.0,319.0"


def test_rows_refuse_what_is_missing(tmp_path):
    with pytest.raises(SystemExit, match="holds neither a run"):
        LT.write_row("grpo", tmp_path)
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="run/metrics.jsonl does not exist: run the train stage"):
        LT.write_row("grpo", tmp_path)
    (tmp_path / "eval_before.json").write_text(json.dumps({"arith": {"n": 4, "accuracy": 0.5}}))
    with pytest.raises(SystemExit, match="has no GSM8K accuracy"):
        LT.eval_numbers(tmp_path, "before")


def test_plot_of_several_rows_and_round_ticks(tmp_path):
    for name, fmt in (("sync", RISING), ("async", RISING[::-1])):
        _write(tmp_path / name / "run" / "metrics.jsonl", _steps(**{SCORE: fmt}))
    LT.main(
        ["plot", str(tmp_path / "sync"), str(tmp_path / "async"), "--labels", "sync", "async", "--out", str(tmp_path / "p.svg")]
    )
    titles = [t.text for t in ET.parse(tmp_path / "p.svg").getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert titles == ["sync", "async"]
    with pytest.raises(SystemExit, match="1 labels for 2 runs"):
        LT.main(["plot", str(tmp_path / "sync"), str(tmp_path / "async"), "--labels", "x", "--out", str(tmp_path / "q.svg")])
    assert LT._ticks(0, 503.3) == [0, 200, 400, 600]
    assert LT._ticks(-0.13, 0.67) == [-0.2, 0.0, 0.2, 0.4, 0.6, 0.8]
    assert LT._ticks(0.0, 0.0) == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_the_scripts_import_no_torch():
    # The table's helpers run before and after device work and in the gate; keep them light.
    code = "import sys; sys.path.insert(0, 'benchmarks'); import learning_table; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


def test_reach_is_the_seconds_to_the_sync_rows_final_accuracy(tmp_path, capsys):
    acc = "reward/gsm8k_strict_acc/mean"
    # sync: 10 steps of 2 s, its last 4 steps average 0.4; async: steps of 1 s (_steps' 2 s halved below)
    # that reach a 4-step mean of 0.4 at its step 6 ((.3+.4+.4+.5)/4 = 0.4), 6 s, 0.30 of sync's 20 s.
    _write(tmp_path / "sync" / "results" / "metrics.jsonl", _steps(**{acc: [0.0, 0.1, 0.1, 0.2, 0.3, 0.3, 0.4, 0.4, 0.4, 0.4]}))
    fast = _steps(**{acc: [0.0, 0.2, 0.3, 0.4, 0.4, 0.5, 0.5]})
    for r in fast:
        r["timing_s/step"] = 1.0
    _write(tmp_path / "async" / "run" / "metrics.jsonl", fast)
    _write(tmp_path / "slow" / "run" / "metrics.jsonl", _steps(**{acc: [0.0, 0.1, 0.2, 0.3, 0.3]}))
    assert LT.main(["reach", str(tmp_path / "sync"), str(tmp_path / "async"), str(tmp_path / "slow"), "--window", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"target: {acc} 0.400, the mean of sync's last 4 steps (20 training s)"
    # sync itself first reaches a 4-step mean of 0.4 at its last step (20 s): (.4+.4+.4+.4)/4
    assert out[3:] == ["| sync | 10 | 20 | 20 | 1.00 |", "| async | 7 | 7 | 6 | 0.30 |", "| slow | 5 | 10 | not reached | - |"]
    with pytest.raises(SystemExit, match="5 steps log .* --window 10 needs as many"):
        LT.reach_table([tmp_path / "slow"], acc, 10)
