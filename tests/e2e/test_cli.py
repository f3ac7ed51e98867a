"""End-to-end runs of the `hybridrl` CLI on a tiny model built from a config (a few seconds each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_all_finite, cli, metrics, weights, without_volatile
from torch.distributed.checkpoint import FileSystemReader

pytestmark = pytest.mark.slow


def base_overrides(model_dir, data, out, **extra):
    o = {
        "data.train_files": data["train"],
        "data.val_files": data["test"],
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 4,
        "actor_rollout_ref.model.path": model_dir,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 2,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.rollout.n": 2,
        "critic.optim.lr": 1e-3,
        "trainer.device": "cpu",
        "trainer.total_training_steps": 3,
        "trainer.default_local_dir": out,
        "trainer.logger": "[console,jsonl,tensorboard]",
        "trainer.test_freq": 2,
        "trainer.resume_mode": "auto",
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_train_changes_parameters_and_logs_finite_metrics(estimator, tiny_model_with_weights, arith_data, tmp_path):
    out = tmp_path / "run"
    extra = {"algorithm.adv_estimator": estimator}
    if estimator == "grpo":
        extra.update({"actor_rollout_ref.actor.use_kl_loss": "true"})
    else:
        extra.update({"algorithm.use_kl_in_reward": "true", "algorithm.kl_ctrl.type": "adaptive"})
    proc = (
        cli("train", "-", *base_overrides(tiny_model_with_weights, arith_data, out, **extra))
        if False
        else cli("train", _write_empty_yaml(tmp_path), *base_overrides(tiny_model_with_weights, arith_data, out, **extra))
    )
    assert "step 3/3" in proc.stdout
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert_all_finite(rows)
    train = rows[1:]
    for key in (
        "critic/score/mean",
        "actor/pg_loss",
        "actor/grad_norm",
        "actor/lr",
        "response_length/mean",
        "timing_s/gen",
        "timing_s/update_actor",
        "perf/throughput",
        "actor/entropy",
    ):
        assert all(key in r for r in train), key
    assert "val-core/arith/reward/mean@1" in rows[0] and "val-core/arith/reward/mean@1" in rows[2]
    before, after = weights(tiny_model_with_weights), weights(out / "checkpoints" / "step_3" / "actor")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) == len(before), f"unchanged parameters: {set(before) - set(changed)}"
    if estimator == "gae":
        assert all("critic/vf_loss" in r and "critic/values/mean" in r for r in train)
        assert all("actor/reward_kl_penalty_coeff" in r for r in train)
        head = FileSystemReader(str(out / "checkpoints" / "step_3" / "critic" / "model")).read_metadata()
        assert "value_head.weight" in head.state_dict_metadata
    else:
        assert all("actor/kl_loss" in r for r in train)
        assert not (out / "checkpoints" / "step_3" / "critic").exists()
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    train = [s for s in samples if s["kind"] == "train"]  # prompt groups: all n responses of a prompt
    assert {s["step"] for s in train} == {1, 2, 3} and all(len(s["responses"]) == len(s["scores"]) == 2 for s in train)
    assert all(s["ground_truth"] is not None and None not in s["advantages"] for s in train)
    assert {s["step"] for s in samples if s["kind"] == "val"} == {0, 2, 3}
    assert list((out / "tensorboard").iterdir()), "no TensorBoard events written"
    # `hybridrl eval` takes a checkpoint's actor directory as it takes an HF model directory
    ev = cli(
        "eval",
        "--model",
        out / "checkpoints" / "step_3" / "actor",
        "--data",
        arith_data["test"],
        "--max-response-length",
        4,
        "--output",
        tmp_path / "eval.jsonl",
    )
    assert "arith: accuracy" in ev.stdout
    rows = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 16
    if estimator == "grpo":  # the native engine decodes greedily to the same answers as HF generate
        cli(
            "eval",
            "--model",
            out / "checkpoints" / "step_3" / "actor",
            "--data",
            arith_data["test"],
            "--max-response-length",
            4,
            "--output",
            tmp_path / "eval_native.jsonl",
            "--rollout",
            "native",
        )
        native = [json.loads(x) for x in (tmp_path / "eval_native.jsonl").read_text().splitlines()]
        assert [r["response"] for r in native] == [r["response"] for r in rows]


def _write_empty_yaml(tmp_path) -> Path:
    p = tmp_path / "base.yaml"
    p.write_text("algorithm:\n  adv_estimator: grpo\n")
    return p


RESUME_VARIANTS = {
    # GRPO with a KL loss: the reference (random init + warm-up) must come back from the checkpoint
    "grpo": {"actor_rollout_ref.actor.use_kl_loss": "true"},
    # PPO with a critic (its weights, Adam moments and schedule), the adaptive KL controller's
    # coefficient, and the native engine (its weights reloaded from the resumed policy)
    "ppo_critic_adaptive_kl_native": {
        "algorithm.adv_estimator": "gae",
        "algorithm.use_kl_in_reward": "true",
        "algorithm.kl_ctrl.type": "adaptive",
        "algorithm.kl_ctrl.target_kl": 0.001,
        "actor_rollout_ref.rollout.name": "native",
    },
}


@pytest.mark.parametrize("variant", list(RESUME_VARIANTS))
def test_kill_and_resume_reproduces_the_uninterrupted_run(variant, tiny_model_dir, arith_data, tmp_path):
    """Save at step 2, SIGKILL the process, resume: steps 3-4 match the uninterrupted run exactly."""
    cfg = _write_empty_yaml(tmp_path)
    common = {
        "actor_rollout_ref.model.random_init": "true",  # the reference must come back from the checkpoint
        "trainer.total_training_steps": 4,
        "trainer.save_freq": 2,
        "trainer.test_freq": -1,
        "warmup.steps": 3,
        "warmup.files": arith_data["sft"],
        "warmup.batch_size": 8,
        **RESUME_VARIANTS[variant],
    }
    a, b = tmp_path / "a", tmp_path / "b"
    cli("train", cfg, *base_overrides(tiny_model_dir, arith_data, a, **common))
    killed = cli(
        "train",
        cfg,
        *base_overrides(tiny_model_dir, arith_data, b, **common),
        env={"HYBRIDRL_KILL_AFTER_SAVE_STEP": "2"},
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    assert (b / "checkpoints" / "latest").read_text() == "step_2"
    resumed = cli("train", cfg, *base_overrides(tiny_model_dir, arith_data, b, **common))
    assert "resumed from" in resumed.stdout and "at step 2/4" in resumed.stdout
    ra, rb = metrics(a), metrics(b)
    assert [r["step"] for r in rb] == [r["step"] for r in ra] == [0, 1, 2, 3, 4]
    for x, y in zip(ra, rb):
        assert without_volatile(x) == without_volatile(y), f"step {x['step']} differs"
    wa, wb = weights(a / "checkpoints" / "step_4" / "actor"), weights(b / "checkpoints" / "step_4" / "actor")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    if variant != "grpo":
        # the KL coefficient moved (adaptive), and the resumed run moved it the same way
        coefs = [r["actor/reward_kl_penalty_coeff"] for r in ra[1:]]
        assert len(set(coefs)) > 1, coefs
        # step 4's values come from the critic that step 3 updated with the restored Adam state:
        # the metrics' equality above covers the critic's weights and optimizer
        assert all("critic/vf_loss" in r and "critic/values/mean" in r for r in rb[3:])


def test_explain_and_config_errors(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  train_files: x.jsonl\n  train_batch_size: 128\nactor_rollout_ref:\n  model:\n    path: m\n")
    out = cli(
        "explain",
        "--no-path-check",
        cfg,
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "algorithm.adv_estimator=grpo",
    ).stdout
    assert "1024" in out and "16" in out  # sequences per step; gradient accumulation
    bad = cli("train", cfg, "actor_rollout_ref.actor.lr=1e-6", check=False)
    assert bad.returncode == 2 and "actor_rollout_ref.actor.optim.lr" in bad.stderr
    bad = cli("explain", "--no-path-check", cfg, "actor_rollout_ref.actor.ppo_mini_batch_size=48", check=False)
    assert bad.returncode == 2 and "data.train_batch_size" in bad.stderr


def test_data_gsm8k_writes_verl_rows(tmp_path):
    src = tmp_path / "train.jsonl"
    src.write_text(json.dumps({"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}) + "\n")
    cli("data", "gsm8k", "--input", src, "--output", tmp_path / "out.parquet")
    import pyarrow.parquet as pq

    row = pq.read_table(tmp_path / "out.parquet").to_pylist()[0]
    assert row["data_source"] == "openai/gsm8k"
    assert row["prompt"][0]["content"].endswith('Let\'s think step by step and output the final answer after "####".')
    assert row["reward_model"]["ground_truth"] == "5"


def test_bad_data_and_raising_reward_function(tiny_model_with_weights, arith_data, tmp_path):
    cfg = _write_empty_yaml(tmp_path)
    broken = tmp_path / "broken.jsonl"
    broken.write_text(Path(arith_data["train"]).read_text() + json.dumps({"data_source": "arith"}) + "\n")
    proc = cli(
        "train",
        cfg,
        *base_overrides(tiny_model_with_weights, arith_data, tmp_path / "r1"),
        f"data.train_files={broken}",
        check=False,
    )
    assert proc.returncode == 2 and f"{broken}, row 64" in proc.stderr and "prompt" in proc.stderr
    reward = tmp_path / "reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    if solution_str.startswith('1'):\n        raise RuntimeError('boom')\n"
        "    return float(solution_str.strip() == ground_truth)\n"
    )
    out = tmp_path / "r2"
    proc = cli(
        "train",
        cfg,
        *base_overrides(tiny_model_with_weights, arith_data, out),
        f"custom_reward_function.path={reward}",
        "actor_rollout_ref.rollout.n=8",
    )
    rows = metrics(out)[1:]
    assert sum(r["reward/errors"] for r in rows) > 0
    assert "boom" in proc.stderr and proc.stderr.count("boom") <= 2  # the first traceback, once


def test_reward_kwargs_reach_the_scorer_and_mismatches_fail_early(tiny_model_with_weights, arith_data, tmp_path):
    cfg = _write_empty_yaml(tmp_path)
    # The built-in arith scorer takes no options: a typo'd or foreign kwarg stops the run up front.
    proc = cli(
        "train",
        cfg,
        *base_overrides(tiny_model_with_weights, arith_data, tmp_path / "r1"),
        "custom_reward_function.reward_kwargs={format_score: 0.1}",
        check=False,
    )
    assert proc.returncode == 2 and "reward_kwargs" in proc.stderr and "'arith'" in proc.stderr
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, bonus=0.0):\n    return bonus\n")
    out = tmp_path / "r2"
    cli(
        "train",
        cfg,
        *base_overrides(tiny_model_with_weights, arith_data, out, **{"trainer.total_training_steps": 1}),
        f"custom_reward_function.path={reward}",
        "custom_reward_function.reward_kwargs={bonus: 0.375}",
    )
    assert metrics(out)[1]["critic/score/mean"] == 0.375


def test_wall_time_budget_ends_the_run_like_its_last_step(tiny_model_with_weights, arith_data, tmp_path):
    out = tmp_path / "run"
    proc = cli(
        "train",
        _write_empty_yaml(tmp_path),
        *base_overrides(
            tiny_model_with_weights, arith_data, out, **{"trainer.total_training_steps": 1000, "trainer.max_wall_time_s": 0.001}
        ),
    )
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1]  # one step, then stop
    assert "val-core/arith/reward/mean@1" in rows[1]  # validated as a last step is
    assert (out / "checkpoints" / "latest").read_text() == "step_1" and "step 1/1000" in proc.stdout


def test_profile_steps_write_a_trace_and_an_op_table(tiny_model_with_weights, arith_data, tmp_path):
    """trainer.profile_steps=[2]: step 2 only, one trace + table per process (the critic shares the
    actor's process here, so its ops are in the same trace); a bad step number is a config error."""
    out = tmp_path / "run"
    proc = cli(
        "train",
        _write_empty_yaml(tmp_path),
        *base_overrides(
            tiny_model_with_weights,
            arith_data,
            out,
            **{"algorithm.adv_estimator": "gae", "trainer.total_training_steps": 2, "trainer.profile_steps": "[2]"},
        ),
    )
    prof = out / "profile"
    assert sorted(p.name for p in prof.iterdir()) == ["step_2"]
    assert sorted(p.name for p in (prof / "step_2").iterdir()) == ["actor_rank0.json", "actor_rank0.txt"]
    trace = json.loads((prof / "step_2" / "actor_rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::mm" in names or "aten::addmm" in names  # the model's matmuls were recorded
    assert "Self CPU" in (prof / "step_2" / "actor_rank0.txt").read_text()
    assert f"step 2 profiled: 1 trace(s) and op table(s) in {prof / 'step_2'}" in proc.stdout
    bad = cli(
        "train",
        _write_empty_yaml(tmp_path),
        *base_overrides(tiny_model_with_weights, arith_data, tmp_path / "bad", **{"trainer.profile_steps": "[0]"}),
        check=False,
    )
    assert bad.returncode == 2 and "trainer.profile_steps=[0] has [0], not a step number" in bad.stderr
