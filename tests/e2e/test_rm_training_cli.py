"""`hybridrl train algorithm.name=rm`: held-out validation, a resumed run continues exactly where an
uninterrupted one is, and `hybridrl export` writes a sequence classifier whose scores are the run's."""

from __future__ import annotations

import json

import pytest
import torch
from cli_helpers import cli, metrics, without_volatile
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from hybridrl.data.converters import make_arith_preferences
from hybridrl.models.tiny import ASSET_DIR

pytestmark = pytest.mark.slow


def _train(tmp_path, files, out, steps, *extra):
    base = tmp_path / "base.yaml"
    base.write_text("algorithm: {name: rm}\n")
    return cli(
        "train",
        base,
        f"data.train_files={files['pairs']}",
        "data.train_batch_size=8",
        "data.max_prompt_length=8",
        "data.max_response_length=4",
        f"actor_rollout_ref.model.path={ASSET_DIR}",
        "actor_rollout_ref.model.random_init=true",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=3e-3",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[console,jsonl]",
        *extra,
    )


def test_rm_training_validates_resumes_and_exports(tmp_path):
    files = make_arith_preferences(tmp_path / "pairs", n=32, max_operand=20, seed=0)
    held_out = make_arith_preferences(tmp_path / "held_out", n=16, max_operand=20, seed=1)["pairs"]
    rows = [json.loads(x) for x in open(files["pairs"]).read().splitlines()]
    rows[0]["margin"] = 0.5  # a margin on one pair: the loss reads it
    (tmp_path / "pairs" / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    _train(tmp_path, files, tmp_path / "full", 4, f"data.val_files={held_out}", "trainer.test_freq=2")
    full = metrics(tmp_path / "full")
    val = [r for r in full if "val/rm/accuracy" in r]
    assert len(val) == 3 and all(r["val/rows"] == 16 for r in val)  # before training, step 2, step 4
    assert all(0.0 <= r["val/rm/accuracy"] <= 1.0 and r["val/rm/loss"] > 0 for r in val)
    train = [r for r in full if "rm/loss" in r]
    assert len(train) == 4 and all(0.0 <= r["rm/accuracy"] <= 1.0 for r in train)
    for r in train:  # the margin is the mean gap of the step's pairs
        assert r["rm/margin_mean"] == pytest.approx(r["rm/chosen_score"] - r["rm/rejected_score"], abs=1e-5)

    _train(tmp_path, files, tmp_path / "cut", 2, "trainer.save_freq=1")
    _train(tmp_path, files, tmp_path / "cut", 4, "trainer.save_freq=1")  # resumes from step 2
    resumed = [without_volatile(r) for r in metrics(tmp_path / "cut") if "rm/loss" in r]
    assert [r["training/global_step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(resumed[2:], train[2:]):
        keys = [k for k in b if k.startswith(("rm/", "actor/grad_norm"))]
        assert {k: a[k] for k in keys} == pytest.approx({k: b[k] for k in keys}, rel=1e-5, abs=1e-6)

    out = cli("export", tmp_path / "full", tmp_path / "rm_hf")
    assert "AutoModelForSequenceClassification" in out.stdout
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm_hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "rm_hf")
    assert model.config.num_labels == 1
    with torch.no_grad():
        right, wrong = (
            float(model(input_ids=torch.tensor([tok(s)["input_ids"] + [tok.eos_token_id]])).logits[0, 0])
            for s in ("3+4=7", "3+4=9")
        )
    assert right != wrong
