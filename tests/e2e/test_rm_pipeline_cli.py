"""SFT -> reward model -> GRPO with the reward model, all from the CLI, on single-digit addition.

The classic RLHF pipeline on the quickstart's task, on CPU:
  1. `hybridrl train algorithm.name=sft` a tiny random-init model, `hybridrl export` it;
  2. `hybridrl eval --n 8 --temperature 1` samples it, `hybridrl data rm-pairs` pairs a right and a
     wrong sample of each prompt; with a few synthetic right-vs-wrong pairs per problem;
  3. `hybridrl train algorithm.name=rm` trains a reward model from the SFT model, exported as a
     sequence classifier;
  4. GRPO from the SFT model with `reward_model.enable=true` and the rule reward's weight 0: the
     policy sees only the reward model's score. The rule (exact-match) score is still computed and
     logged as reward_model/rule_score/mean: the RM score must rise and the true accuracy of the policy's
     samples must not fall (a reward model that is exploited would show the RM score rising alone).
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import assert_all_finite, cli, metrics

from hybridrl.data.converters import make_arith_preferences
from hybridrl.models.tiny import ASSET_DIR

pytestmark = pytest.mark.slow

BASE = f"""\
data: {{train_batch_size: 16, max_prompt_length: 8, max_response_length: 4}}
actor_rollout_ref:
  model: {{path: {ASSET_DIR}}}
  actor: {{ppo_mini_batch_size: 16, optim: {{lr: 3.0e-3}}}}
  rollout: {{name: hf, n: 8}}
algorithm: {{adv_estimator: grpo}}
trainer: {{device: cpu, logger: [console, jsonl], seed: 1}}
"""


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _window_mean(rows, key, start, stop):
    vals = [r[key] for r in rows if key in r][start:stop]
    return sum(vals) / len(vals)


def test_sft_then_reward_model_then_grpo_raises_rm_score_and_true_accuracy(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(BASE)
    problems = [(a, b) for a in range(10) for b in range(10)]
    rl = _rows(
        tmp_path / "train.jsonl",
        [
            {
                "data_source": "arith",
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"ground_truth": str(a + b)},
            }
            for a, b in problems
        ],
    )
    sft = _rows(
        tmp_path / "sft.jsonl",
        [{**json.loads(line), "response": str(sum(p))} for line, p in zip(rl.read_text().splitlines(), problems)],
    )

    # 1. SFT
    cli(
        "train",
        base,
        "algorithm.name=sft",
        f"data.train_files={sft}",
        "data.train_batch_size=50",
        "actor_rollout_ref.model.random_init=true",
        "trainer.total_training_steps=40",
        f"trainer.default_local_dir={tmp_path / 'sft'}",
    )
    cli("export", tmp_path / "sft", tmp_path / "sft_hf")

    # 2. preference pairs: sampled right vs wrong answers of the SFT model, and synthetic ones
    cli(
        "eval",
        "--model",
        tmp_path / "sft_hf",
        "--data",
        rl,
        "--n",
        8,
        "--temperature",
        1.0,
        "--max-response-length",
        4,
        "--device",
        "cpu",
        "--output",
        tmp_path / "samples.jsonl",
    )
    out = cli(
        "data", "rm-pairs", "--input", tmp_path / "samples.jsonl", "--output", tmp_path / "sampled.jsonl", "--pairs-per-prompt", 4
    )
    assert "pairs from" in out.stdout
    pairs = [json.loads(x) for x in (tmp_path / "sampled.jsonl").read_text().splitlines()]
    for seed in range(4):  # each problem's right sum against 4 wrong ones
        syn = make_arith_preferences(tmp_path / f"syn{seed}", n=100, max_operand=9, seed=seed)["pairs"]
        pairs += [json.loads(x) for x in open(syn).read().splitlines()]
    _rows(tmp_path / "pairs.jsonl", pairs)

    # 3. the reward model
    cli(
        "train",
        base,
        "algorithm.name=rm",
        f"data.train_files={tmp_path / 'pairs.jsonl'}",
        "data.train_batch_size=64",
        "data.max_response_length=5",
        f"actor_rollout_ref.model.path={tmp_path / 'sft_hf'}",
        "actor_rollout_ref.actor.optim.lr=2e-3",
        "trainer.total_training_steps=800",
        f"trainer.default_local_dir={tmp_path / 'rm'}",
    )
    rm_rows = metrics(tmp_path / "rm")
    assert_all_finite(rm_rows)
    acc_first, acc_last = _window_mean(rm_rows, "rm/accuracy", 0, 50), _window_mean(rm_rows, "rm/accuracy", -50, None)
    print(f"reward model: train pair accuracy {acc_first:.3f} -> {acc_last:.3f}")
    # measured over trainer.seed 1..4 (2026-11-28, CPU): +0.352, +0.391, +0.384, +0.262
    assert acc_last > acc_first + 0.15
    out = cli("export", tmp_path / "rm", tmp_path / "rm_hf")
    assert "AutoModelForSequenceClassification" in out.stdout

    # 4. GRPO on the reward model alone (rule_weight=0 is the default)
    cli(
        "train",
        base,
        f"data.train_files={rl}",
        f"data.val_files={rl}",
        f"actor_rollout_ref.model.path={tmp_path / 'sft_hf'}",
        "actor_rollout_ref.actor.optim.lr=5e-4",
        "reward_model.enable=true",
        f"reward_model.model.path={tmp_path / 'rm_hf'}",
        "trainer.total_training_steps=40",
        "trainer.test_freq=20",
        f"trainer.default_local_dir={tmp_path / 'grpo'}",
    )
    rows = metrics(tmp_path / "grpo")
    train = [r for r in rows if "reward_model/score/mean" in r]
    assert len(train) == 40
    for r in train:  # the policy's score is the RM score alone
        assert r["critic/score/mean"] == pytest.approx(r["reward_model/score/mean"], abs=1e-5)
    rm_first, rm_last = (
        _window_mean(train, "reward_model/score/mean", 0, 10),
        _window_mean(train, "reward_model/score/mean", -10, None),
    )
    acc_first, acc_last = (
        _window_mean(train, "reward_model/rule_score/mean", 0, 10),
        _window_mean(train, "reward_model/rule_score/mean", -10, None),
    )
    val = [r["val-core/arith/reward/mean@1"] for r in rows if "val-core/arith/reward/mean@1" in r]
    print(
        f"GRPO on the RM: RM score {rm_first:.3f} -> {rm_last:.3f}; "
        f"true accuracy (rule) {acc_first:.3f} -> {acc_last:.3f}; greedy {val}"
    )
    # Measured over trainer.seed 1..4 (2026-11-28, CPU): RM score +1.69, +2.47, +0.98, +1.47; true
    # accuracy +0.046, +0.057, +0.017, +0.038. A 10-step window's accuracy has a standard error of about
    # 0.011 (1,280 samples), so "it rose" would fail by chance; what the test guards is that the
    # policy does not exploit the reward model: the RM score rises while the true accuracy does not fall.
    assert rm_last > rm_first + 0.5
    assert acc_last > acc_first - 0.03, (acc_first, acc_last)
    # Greedy held-out accuracy is printed, not asserted: on this tiny task it moves by a few problems
    # either way with the sampling seed of step 2 (0.28 -> 0.19..0.37 over the seeds tried).
