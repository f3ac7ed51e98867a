"""The Python API (hybridrl/api.py): the quickstart trained in-process from Python objects, twice in one
process with equal metrics; a YAML path; a model object; a Ray run with 2 CPU workers; bad input."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from api_helpers import quickstart_dict, rows
from cli_helpers import VOLATILE, weights

import hybridrl
from hybridrl import RLTrainer

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SEED_OVERRIDES = [
    "trainer.total_training_steps=3",
    "warmup.steps=30",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
    "trainer.test_freq=3",
    "trainer.logger=[jsonl]",
]


def exact_match(data_source, solution_str, ground_truth, extra_info):
    return {"score": float(solution_str.strip() == str(ground_truth)), "length": float(len(solution_str))}


def stable(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in history]


def test_quickstart_twice_in_one_process_gives_the_same_run(tmp_path):
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    env_before = dict(os.environ)
    mine = (random.random(), float(np.random.rand()), float(torch.rand(())))  # what the caller's RNGs give next
    random.seed(1234)
    np.random.seed(1234)
    torch.manual_seed(1234)
    results = []
    for i in range(2):
        trainer = RLTrainer(
            quickstart_dict(),
            reward_fn=exact_match,
            train_data=rows("train", 64),
            val_data=rows("test", 16),
            overrides=SEED_OVERRIDES + [f"trainer.default_local_dir={tmp_path / f'run{i}'}"],
        )
        results.append(trainer.fit())
    first, second = results
    assert [r["step"] for r in first.history] == [0, 1, 2, 3]
    assert stable(first.history) == stable(second.history)  # every metric equal, run after run
    scores = [r["critic/score/mean"] for r in first.history[1:]]
    assert any(s > 0 for s in scores), scores  # the warm-up gives the policy right answers: a non-trivial run
    assert first.history[1]["reward/length/mean"] > 0 and first.history[1]["reward/errors"] == 0
    assert first.validation == {k: v for k, v in first.history[-1].items() if k.startswith(("val-core/", "val-aux/"))}
    assert "val-core/arith/reward/mean@1" in first.validation
    assert first.metrics["training/global_step"] == 3 and first.checkpoint == first.run_dir / "checkpoints" / "step_3"
    # `hybridrl eval` cannot rebuild a reward function object: the summary does not suggest it
    assert list(json.loads((first.run_dir / "run_summary.json").read_text())["commands"]) == ["report", "export"]
    # the objects became files under inputs/, and config.yaml names them: a CLI config that reruns the run
    saved = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    assert saved["data"]["train_files"] == str(first.run_dir / "inputs" / "train_data.jsonl")
    assert [json.loads(x) for x in (first.run_dir / "inputs/train_data.jsonl").read_text().splitlines()] == rows("train", 64)
    # the final model: the last checkpoint's policy, as a transformers model
    model = first.model()
    expected = weights(first.checkpoint / "actor")
    assert {k: v for k, v in model.state_dict().items() if k in expected}.keys() == expected.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items())
    # nothing left behind: the caller's RNGs continue where they were, the environment is as it was
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == mine
    assert dict(os.environ) == env_before
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_yaml_path_with_overrides_and_the_builtin_scorer(tmp_path):
    config = tmp_path / "quickstart.yaml"
    cfg = quickstart_dict()
    cfg["data"]["train_files"] = str(ROOT / "data/arith/train.jsonl")
    cfg["data"]["val_files"] = str(ROOT / "data/arith/test.jsonl")
    config.write_text(yaml.safe_dump(cfg))
    result = RLTrainer(
        str(config), overrides=SEED_OVERRIDES + ["warmup.steps=2", f"trainer.default_local_dir={tmp_path / 'run'}"]
    ).fit()
    assert [r["step"] for r in result.history] == [0, 1, 2, 3]
    assert all(r["reward/errors"] == 0 for r in result.history[1:])
    assert not (result.run_dir / "inputs").exists()  # paths were given: nothing to write
    assert "eval" in json.loads((result.run_dir / "run_summary.json").read_text())["commands"]  # built-in scorers


def test_grpo_short_form_with_a_model_object_leaves_the_callers_model_alone(tiny_model_with_weights, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_with_weights)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_with_weights)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = hybridrl.grpo(
        model,
        rows("train", 16),
        exact_match,
        tokenizer=tokenizer,
        batch_size=4,
        rollout_n=2,
        steps=2,
        mini_batch_size=4,
        micro_batch_size=8,
        lr=1e-2,
        max_prompt_length=8,
        max_response_length=4,
        device="cpu",
        output_dir=str(tmp_path / "run"),
        **{"trainer.logger": ["jsonl"]},
    )
    assert [r["step"] for r in result.history] == [1, 2]
    assert result.history[0]["actor/kl_loss"] >= 0  # grpo(): the KL loss to the reference is on
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # trained a copy
    trained = result.model().state_dict()
    assert any(not torch.equal(trained[k], before[k]) for k in before)
    saved = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert saved["actor_rollout_ref"]["model"]["path"] == str(result.run_dir / "inputs" / "actor")
    assert saved["actor_rollout_ref"]["rollout"]["n"] == 2 and saved["algorithm"]["adv_estimator"] == "grpo"


def test_two_ray_cpu_workers_through_the_api(tmp_path):
    result = RLTrainer(
        quickstart_dict(),
        reward_fn=exact_match,
        train_data=rows("train", 32),
        overrides=[
            "trainer.n_gpus_per_node=2",
            "trainer.total_training_steps=1",
            "warmup.steps=2",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            "data.val_files=null",
            "ray_init.num_cpus=2",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ],
    ).fit()
    assert [r["step"] for r in result.history] == [0, 1] and result.history[1]["reward/errors"] == 0
    assert sorted(p.name for p in result.checkpoint.glob("rng_*.pt")) == ["rng_colocated_0.pt", "rng_colocated_1.pt"]
    import ray

    assert not ray.is_initialized()  # the cluster the run started is gone


@pytest.mark.parametrize(
    "override", ["actor_rollout_ref.actor.lrr=1e-3", "data.train_batch_size=0", "actor_rollout_ref.model.path=/no/such/model"]
)
def test_api_error_is_the_line_the_cli_prints(override, tmp_path):
    from cli_helpers import cli

    config, extra = str(ROOT / "configs/quickstart.yaml"), [f"trainer.default_local_dir={tmp_path / 'run'}"]
    proc = cli("train", config, override, *extra, check=False, cwd=ROOT)
    assert proc.returncode == 2
    with pytest.raises(hybridrl.HybridRLError) as e:
        cwd = os.getcwd()
        os.chdir(ROOT)  # the config's relative paths, as for the CLI
        try:
            RLTrainer(config, overrides=[override, *extra]).fit()
        finally:
            os.chdir(cwd)
    assert proc.stderr.strip().splitlines()[-1] == f"hybridrl: error: {e.value}"
