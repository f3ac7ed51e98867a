"""benchmarks/learning_diagnose.py: the windows of a learning-table row and the question-by-question
comparison of two rows, on files written here with numbers worked out by hand, and its refusals."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import learning_diagnose as LD  # noqa: E402


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _cells(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_windows_from_the_per_step_group_metric(tmp_path):
    # 5 steps, windows of 2: (1-2), (3-4), (5); step s takes s seconds; no KL term logged
    steps = [
        {"step": s, "timing_s/step": float(s), LD.STRICT: 0.1 * s, LD.FORMAT: 0.5, "actor/entropy": 0.4 - 0.05 * s,
         "response_length/mean": 100.0 + s, "training/epoch": s // 4, LD.NO_SIGNAL: 0.2 * s, LD.ALL_TOP: 0.1 * s}
        for s in range(1, 6)
    ]  # fmt: skip
    _jsonl(tmp_path / "results" / "metrics.jsonl", [{"step": 0, "val-core/x": 0.0}, *steps])  # a val-only row is skipped
    rows = _cells(LD.windows(tmp_path, 2))
    assert [r[0] for r in rows] == ["1-2", "3-4", "5-5"]
    assert [r[1] for r in rows] == ["3", "10", "15"]  # training seconds at each window's end
    assert [r[2] for r in rows] == ["0.150", "0.350", "0.500"]
    assert [r[4] for r in rows] == ["0.325", "0.225", "0.150"]  # entropy
    assert [r[5] for r in rows] == ["-", "-", "-"]  # no actor/kl_loss (PPO, DAPO)
    assert [r[7] for r in rows] == ["0", "1", "1"]  # the pass over the data at the window's last step
    assert [r[8] for r in rows] == ["0.30", "0.70", "1.00"] and [r[9] for r in rows] == ["0.15", "0.35", "0.50"]
    assert "per step (critic/groups/*)" in LD.windows(tmp_path, 2)


def test_windows_of_a_dynamic_sampling_run_count_every_generated_group(tmp_path):
    """DAPO: the trained batch's critic/groups/* are 0 by construction, so the columns read the groups
    before the filter: train/generated/* when logged, else the dropped share from the group counts."""
    rng = random.Random()
    gen = [rng.randint(48, 200) for _ in range(4)]
    kept = [rng.randint(32, g) for g in gen]
    steps = [
        {"step": s + 1, "timing_s/step": 1.0, LD.NO_SIGNAL: 0.0, LD.ALL_TOP: 0.0, LD.GENERATED: g, LD.KEPT: k}
        for s, (g, k) in enumerate(zip(gen, kept))
    ]
    _jsonl(tmp_path / "results" / "metrics.jsonl", steps)
    table = LD.windows(tmp_path, 2)
    rows = [r for r in _cells(table) if len(r) > 2]
    assert [r[8] for r in rows] == [f"{1 - sum(kept[i : i + 2]) / sum(gen[i : i + 2]):.2f}" for i in (0, 2)]
    assert [r[9] for r in rows] == ["-", "-"]
    assert "dropped by dynamic sampling" in table and table.endswith(LD.DYNAMIC_NOTE)
    # with the per-step metric of every generated group, that is what the columns show
    alike, top = [rng.random() for _ in steps], [rng.random() / 2 for _ in steps]
    for r, a, t in zip(steps, alike, top):
        r.update({LD.GEN_NO_SIGNAL: a, LD.GEN_ALL_TOP: t})
    _jsonl(tmp_path / "results" / "metrics.jsonl", steps)
    rows = [r for r in _cells(LD.windows(tmp_path, 2)) if len(r) > 2]
    assert [r[8] for r in rows] == [f"{(alike[i] + alike[i + 1]) / 2:.2f}" for i in (0, 2)]
    assert [r[9] for r in rows] == [f"{(top[i] + top[i + 1]) / 2:.2f}" for i in (0, 2)]


def test_windows_count_the_logged_groups_of_an_older_run(tmp_path):
    """Without critic/groups/*, the groups in samples.jsonl: fresh random scores, counted here directly."""
    rng = random.Random()
    _jsonl(tmp_path / "run" / "metrics.jsonl", [{"step": s, "timing_s/step": 1.0} for s in range(1, 5)])
    samples, want = [], {}
    for s in range(1, 5):
        for _ in range(3):
            scores = [rng.choice([0.0, 1.0]) for _ in range(4)] if rng.random() < 0.5 else [rng.choice([0.0, 0.2, 1.0])] * 4
            samples.append({"step": s, "kind": "train", "scores": scores})
            want.setdefault((s - 1) // 2, []).append(scores)
    samples.append({"step": 1, "kind": "val", "scores": [0.0]})  # validation groups do not count
    samples.append({"step": 1, "kind": "train", "scores": [1.0]})  # nor a prompt of one sample
    _jsonl(tmp_path / "run" / "samples.jsonl", samples)
    top = max(x for s in samples if s["kind"] == "train" for x in s["scores"])
    for row, groups in zip(_cells(LD.windows(tmp_path, 2)), want.values()):
        alike = [g for g in groups if len(set(g)) == 1]
        assert row[8] == f"{len(alike) / len(groups):.2f} (of {len(groups)})"
        assert row[9] == f"{sum(g[0] == top for g in alike) / len(groups):.2f}"


def _evals(path: Path, right: list[bool]) -> None:
    _jsonl(path / "results" / "eval_after.jsonl", [{"index": i, "score": float(r)} for i, r in enumerate(right)])


def test_flips_count_every_cell_and_mcnemars_exact_p(tmp_path):
    rng = random.Random()
    a = [rng.random() < 0.45 for _ in range(300)]
    b = [x if rng.random() < 0.8 else not x for x in a]
    _evals(tmp_path / "A", a)
    _evals(tmp_path / "B", b)
    (cells,) = _cells(LD.flips(tmp_path / "A", tmp_path / "B"))
    only_a = sum(x and not y for x, y in zip(a, b))
    only_b = sum(y and not x for x, y in zip(a, b))
    assert cells[2:9] == [
        "300", f"{100 * sum(a) / 300:.1f}%", f"{100 * sum(b) / 300:.1f}%", str(sum(x and y for x, y in zip(a, b))),
        str(only_a), str(only_b), str(sum(not x and not y for x, y in zip(a, b))),
    ]  # fmt: skip
    # the binomial tail in float64 from log-gamma, another way than math.comb
    n, k = only_a + only_b, min(only_a, only_b)
    tail = sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2)) for i in range(k + 1))
    assert cells[10] == f"{min(1.0, 2 * tail):.3f}"


def test_mcnemar_on_textbook_cases():
    assert LD.mcnemar(0, 5) == pytest.approx(2 / 32)  # five flips all one way: 2 * (1/2)^5
    assert LD.mcnemar(3, 3) == 1.0 and LD.mcnemar(0, 0) == 1.0
    assert LD.mcnemar(183, 145) == pytest.approx(0.0411, abs=5e-4)  # the two GRPO rows of docs/learning.md


def test_bad_inputs_are_refused_with_the_reason(tmp_path):
    _evals(tmp_path / "A", [True, False])
    _evals(tmp_path / "B", [True, False, True])
    with pytest.raises(SystemExit, match="answered different questions"):
        LD.flips(tmp_path / "A", tmp_path / "B")
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        LD.windows(tmp_path / "A", 25)
    _jsonl(tmp_path / "C" / "metrics.jsonl", [{"step": 1, "timing_s/step": 1.0}])
    with pytest.raises(SystemExit, match="at least one step"):
        LD.windows(tmp_path / "C", 0)
    (tmp_path / "C" / "metrics.jsonl").write_text('{"step": 1, "timing_s/step": 1.0}\n{"step": 2, trunc\n')
    with pytest.raises(SystemExit, match=r"metrics.jsonl:2: not JSON"):
        LD.windows(tmp_path / "C", 5)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/learning_diagnose.py"), "flips", str(tmp_path / "A"), str(tmp_path / "nowhere")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode != 0 and "no eval_after.jsonl" in proc.stderr
