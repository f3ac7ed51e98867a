"""benchmarks/learning_table.sh end to end on CPU: the GRPO row's train, after and row stages on the tests'
tiny model and a few GSM8K-shaped questions, as a device call runs them, and the same row with the base
model's row through benchmarks/learning_queue.sh, detached and packed (docs/learning.md)."""

import json
import os
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CPU = [  # the tiny model on CPU: hf generation, 2 prompts x 2 samples, 8 tokens, 2 steps
    "trainer.device=cpu",
    "actor_rollout_ref.rollout.name=hf",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "data.max_response_length=8",
    "trainer.total_training_steps=2",
]


def _stage(stage, model, gsm8k, out, *extra, env=None):
    proc = subprocess.run(
        ["bash", "benchmarks/learning_table.sh", stage, "grpo", model, str(gsm8k), str(out), *extra],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_grpo_row_trains_evaluates_and_prints_on_cpu(tmp_path, tiny_model_with_weights):
    gsm8k = _gsm8k(tmp_path)
    out = tmp_path / "row"
    train = _stage("train", tiny_model_with_weights, gsm8k, out, *CPU, env={"BUDGET_S": "300"})
    assert "configs/gsm8k_grpo.yaml" in train.stderr and "trainer.max_wall_time_s=300" in train.stderr
    _stage("after", tiny_model_with_weights, gsm8k, out, env={"EVAL_ARGS": "--max-response-length 8"})
    printed = _stage("row", tiny_model_with_weights, gsm8k, out).stdout

    (row,) = json.loads((out / "results" / "row.json").read_text())
    summary = json.loads((out / "eval_after.json").read_text())["openai/gsm8k"]
    answers = [json.loads(line) for line in (out / "eval_after.jsonl").read_text().splitlines()]
    assert row["recipe"] == "grpo" and row["model"] == Path(tiny_model_with_weights).name and row["mode"] == "sync"
    assert (row["steps"], row["budget_s"], row["n_eval"]) == (2, 300.0, 3)  # 2 steps, every test question
    assert (row["strict"], row["flexible"]) == (summary["accuracy"], summary["flexible_accuracy"])
    assert row["format_rate"] == sum("#### " in a["response"][-300:] for a in answers) / 3
    assert all(0.0 <= row[k] <= 1.0 for k in ("strict", "flexible", "format_rate", "reward_first", "reward_last"))
    steps = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_first"] == pytest.approx(sum(s["critic/score/mean"] for s in steps) / 2)  # 2 steps: both windows
    assert row["train_s"] == pytest.approx(sum(s["timing_s/step"] for s in steps)) and row["wall_s"] >= row["train_s"]
    assert (out / "results" / "row.md").read_text().splitlines()[-1] in printed
    svg = ET.parse(out / "results" / "reward_vs_time.svg").getroot()
    first = svg.find("{http://www.w3.org/2000/svg}polyline")
    assert len(first.get("points").split()) == 2  # one point per step
    cfg = (out / "results" / "config.yaml").read_text()
    assert "lr: 2.0e-06" in cfg and "format_needs_work: true" in cfg and "max_wall_time_s: 300.0" in cfg


def _gsm8k(tmp_path):
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    for split, n in (("train", 8), ("test", 3)):
        rows = [{"question": f"What is {i} + {i + 3}?", "answer": f"{i}+{i + 3}={2 * i + 3}\n#### {2 * i + 3}"} for i in range(n)]
        (gsm8k / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return gsm8k


def _queue(*args, env=None, timeout=60):
    return subprocess.run(
        ["bash", "benchmarks/learning_queue.sh", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_queue_runs_rows_detached_and_packs_each_rows_results(tmp_path, tiny_model_with_weights):
    gsm8k, root, dest = _gsm8k(tmp_path), tmp_path / "lt", tmp_path / "back"
    env = {"BUDGET_S": "300", "TRAIN_ARGS": " ".join(CPU), "EVAL_ARGS": "--max-response-length 8"}
    bad = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), "grpo", "base:nope", env=env)
    assert bad.returncode != 0 and "unknown recipe 'nope'" in bad.stderr and not root.exists()  # checked first

    started = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), "base:grpo", "grpo", env=env)
    assert started.returncode == 0, started.stderr
    again = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), "grpo", env=env)
    assert again.returncode == 2 and "has not finished" in again.stderr  # one queue per ROOT at a time
    waited = _queue("wait", str(root), "540", str(dest), timeout=600)
    assert waited.returncode == 0, waited.stdout + waited.stderr + (root / "queue.log").read_text()
    assert "all rows done" in waited.stdout and "exactly right" in waited.stdout

    for name in ("base_grpo", "grpo"):  # only the packed files came back: read the rows from them
        with tarfile.open(dest / f"{name}.tgz") as tgz:
            tgz.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    base = json.loads((tmp_path / "unpacked" / "base_grpo" / "results" / "row.json").read_text())
    (trained,) = json.loads((tmp_path / "unpacked" / "grpo" / "results" / "row.json").read_text())
    assert base[0]["recipe"] == "grpo (base model)" and base[0]["n_eval"] == 3
    assert (trained["recipe"], trained["steps"], trained["budget_s"], trained["n_eval"]) == ("grpo", 2, 300.0, 3)
    unpacked = tmp_path / "unpacked"
    assert (unpacked / "grpo.train.log").is_file() and (unpacked / "grpo" / "results" / "reward_vs_time.svg").is_file()
    status = (dest / "queue_status.txt").read_text()
    assert "grpo: train rc=0" in status and "grpo: after rc=0" in status and "| grpo | " in status
