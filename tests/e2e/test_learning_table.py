"""The learning table end to end on CPU (docs/learning.md): benchmarks/learning_queue.sh runs the base
model's row and the GRPO row (benchmarks/learning_table.sh's before, train, after and row stages) on the
tests' tiny model and a few GSM8K-shaped questions, detached as on the GPU machine, and packs each row;
the row's numbers are checked against the run and the eval they came from."""

import json
import os
import subprocess
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tiny_models import SHAPE

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


def test_the_queue_runs_the_base_and_grpo_rows_detached_and_packs_what_the_rows_say(tmp_path, tiny_model_with_weights):
    gsm8k, root, dest = _gsm8k(tmp_path), tmp_path / "lt", tmp_path / "back"
    env = {"BUDGET_S": "300", "TRAIN_ARGS": " ".join(CPU), "EVAL_ARGS": "--max-response-length 8"}
    bad = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), "grpo", "base:nope", env=env)
    assert bad.returncode != 0 and "unknown recipe 'nope'" in bad.stderr and not root.exists()  # checked first

    started = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), "base:grpo", "grpo", env=env)
    assert started.returncode == 0, started.stderr
    # written before `start` returns, so that a `wait` or a second `start` right after it finds the queue
    assert "queued 2 row(s): base:grpo grpo" in (root / "status").read_text().splitlines()[0]
    again = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), "grpo", env=env)
    assert again.returncode == 2 and "has not finished" in again.stderr  # one queue per ROOT at a time
    waited = _queue("wait", str(root), "540", str(dest), timeout=600)
    assert waited.returncode == 0, waited.stdout + waited.stderr + (root / "queue.log").read_text()
    assert "all rows done" in waited.stdout and "exactly right" in waited.stdout

    got = tmp_path / "unpacked"  # only the packed files came back: everything below is read from them
    for name in ("base_grpo", "grpo"):
        with tarfile.open(dest / f"{name}.tgz") as tgz:
            tgz.extractall(got, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    train_log = (got / "grpo.train.log").read_text()
    assert "configs/gsm8k_grpo.yaml" in train_log and "trainer.max_wall_time_s=300" in train_log
    base = json.loads((got / "base_grpo" / "results" / "row.json").read_text())
    assert base[0]["recipe"] == "grpo (base model)" and base[0]["n_eval"] == 3 and base[0]["steps"] == 0

    res = got / "grpo" / "results"
    (row,) = json.loads((res / "row.json").read_text())
    summary = json.loads((res / "eval_after.json").read_text())["openai/gsm8k"]
    answers = [json.loads(line) for line in (res / "eval_after.jsonl").read_text().splitlines()]
    assert row["recipe"] == "grpo" and row["model"] == Path(tiny_model_with_weights).name and row["mode"] == "sync"
    assert (row["steps"], row["budget_s"], row["n_eval"]) == (2, 300.0, 3)  # 2 steps, every test question
    assert (row["strict"], row["flexible"]) == (summary["accuracy"], summary["flexible_accuracy"])
    assert row["format_rate"] == sum("#### " in a["response"][-300:] for a in answers) / 3
    assert all(0.0 <= row[k] <= 1.0 for k in ("strict", "flexible", "format_rate", "reward_first", "reward_last"))
    steps = [json.loads(line) for line in (res / "metrics.jsonl").read_text().splitlines()]
    assert row["reward_first"] == pytest.approx(sum(s["critic/score/mean"] for s in steps) / 2)  # 2 steps: both windows
    assert row["train_s"] == pytest.approx(sum(s["timing_s/step"] for s in steps)) and row["wall_s"] >= row["train_s"]
    status = (dest / "queue_status.txt").read_text()
    assert "grpo: train rc=0" in status and "grpo: after rc=0" in status
    assert (res / "row.md").read_text().splitlines()[-1] in status  # the printed row
    svg = ET.parse(res / "reward_vs_time.svg").getroot()
    first = svg.find("{http://www.w3.org/2000/svg}polyline")
    assert len(first.get("points").split()) == 2  # one point per step
    cfg = (res / "config.yaml").read_text()
    assert "lr: 2.0e-06" in cfg and "format_needs_work: true" in cfg and "max_wall_time_s: 300.0" in cfg


def _tiny_llama(out):
    """The tests' tiny model with the Llama architecture (SmolLM2's), random weights."""
    import torch

    from hybridrl.models.loading import load_causal_lm, load_tokenizer
    from hybridrl.models.tiny import write_tiny_model_dir

    src = write_tiny_model_dir(out / "config", family="llama", **SHAPE)
    torch.manual_seed(0)
    model = load_causal_lm(str(src), random_init=True)
    assert type(model).__name__ == "LlamaForCausalLM"
    model.save_pretrained(out / "llama")
    load_tokenizer(str(src)).save_pretrained(out / "llama")
    return out / "llama"


def test_the_rows_still_to_run_on_a_gpu_run_through_the_queue(tmp_path, tiny_model_with_weights):
    """The tool row (multi-turn with the python tool, on the native engine) and the SmolLM2 row (a
    Llama model) train and evaluate end to end, each with its recipe's settings: rows whose GPU
    numbers are still owed (docs/learning.md) are ready to run. (RLOO's estimator and its KL in the
    reward run in tests/trainer/test_estimators_run.py.)"""
    gsm8k, root = _gsm8k(tmp_path), tmp_path / "lt"
    llama = _tiny_llama(tmp_path)
    train = [a for a in CPU if not a.startswith("actor_rollout_ref.rollout.name")]  # the native engine: the tool row needs it
    env = {"BUDGET_S": "300", "TRAIN_ARGS": " ".join(train), "EVAL_ARGS": "--max-response-length 8"}
    rows = ("tool", f"smollm2_grpo={llama}")
    started = _queue("start", tiny_model_with_weights, str(gsm8k), str(root), *rows, env=env)
    assert started.returncode == 0, started.stderr
    waited = _queue("wait", str(root), "540", timeout=600)
    assert waited.returncode == 0 and "all rows done" in waited.stdout, waited.stdout + (root / "queue.log").read_text()

    def results(name):
        res = root / name / "results"
        (row,) = json.loads((res / "row.json").read_text())
        steps = [json.loads(line) for line in (res / "metrics.jsonl").read_text().splitlines()]
        assert (row["recipe"], row["steps"], row["n_eval"], len(steps)) == (name, 2, 3, 2)
        return row, steps, (res / "config.yaml").read_text()

    _, steps, cfg = results("tool")
    assert "multi_turn: {enable: true, format: code, max_assistant_turns: 3" in cfg
    assert f"tool_config_path: {root}/repo/configs/tools/python.yaml" in cfg
    assert all(s["agent/turns_mean"] >= 1.0 for s in steps)

    row, _, cfg = results("smollm2_grpo")
    assert row["model"] == "llama" and f"path: {llama}" in cfg
