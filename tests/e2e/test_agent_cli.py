"""Multi-turn training from the CLI on the tiny model (CPU, native engine): an interaction asks
for a retry after a wrong answer; the run trains on the whole conversation with the user's
tokens masked, the engine's and the trainer's log-probs of the model's tokens agree, and a
kill + resume reproduces the uninterrupted run exactly."""

from __future__ import annotations

import pytest
import torch
from cli_helpers import assert_all_finite, cli, metrics, weights, without_volatile
from test_cli import _write_empty_yaml, base_overrides

pytestmark = pytest.mark.slow

TEACHER = '''
from hybridrl.rollout.agent.interaction import Interaction, InteractionTurn


class RetryTeacher(Interaction):
    """A wrong answer gets one retry request; a right one ends the conversation."""

    async def respond(self, messages, state):
        if messages[-1]["content"].strip() == str(state["ground_truth"]):
            return InteractionTurn("", done=True, reward=0.0)
        return InteractionTurn("\\nno try again\\n", done=False, reward=-0.1)
'''

LAST_LINE_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 if the conversation's last line (the final answer) is the right integer."""
    return float(solution_str.strip().split("\\n")[-1].strip() == str(ground_truth))
'''


def test_multi_turn_with_an_interaction_trains_and_resumes_exactly(tiny_model_dir, arith_data, tmp_path):
    (tmp_path / "teacher_env.py").write_text(TEACHER)
    (tmp_path / "reward.py").write_text(LAST_LINE_REWARD)
    (tmp_path / "interactions.yaml").write_text("interaction:\n  - name: teacher\n    class_name: teacher_env.RetryTeacher\n")
    cfg = _write_empty_yaml(tmp_path)
    common = {
        "actor_rollout_ref.model.random_init": "true",
        "data.max_response_length": 16,
        "actor_rollout_ref.rollout.multi_turn.enable": "true",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path": tmp_path / "interactions.yaml",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": 1,
        "actor_rollout_ref.actor.use_kl_loss": "true",
        "custom_reward_function.path": tmp_path / "reward.py",
        "trainer.total_training_steps": 4,
        "trainer.save_freq": 2,
        "trainer.test_freq": -1,
        "warmup.steps": 3,
        "warmup.files": arith_data["sft"],
        "warmup.batch_size": 8,
    }
    env = {"PYTHONPATH": str(tmp_path)}
    a, b = tmp_path / "a", tmp_path / "b"
    explained = cli("explain", cfg, *base_overrides(tiny_model_dir, arith_data, a, **common), env=env).stdout
    assert "multi_turn" in explained or "multi-turn" in explained, explained
    cli("train", cfg, *base_overrides(tiny_model_dir, arith_data, a, **common), env=env)
    rows = metrics(a)
    assert_all_finite(rows)
    train = [r for r in rows if r["step"] > 0]
    assert len(train) == 4
    # wrong first answers got a user turn: some trajectories have two model turns
    assert max(r["agent/user_turns_mean"] for r in train) > 0
    assert max(r["agent/turns_mean"] for r in train) > 1
    assert all(r["agent/turns_mean"] <= 2 for r in train)  # max_user_turns=1
    assert min(r["reward/agent/mean"] for r in train) < 0  # the retry's -0.1 reached the score
    # the trainer reads the user's tokens as context: its log-probs of the model's tokens are the engine's
    assert max(r["training/rollout_probs_diff_max"] for r in train) < 1e-4
    # kill after the save at step 2, resume: steps 3-4 as in the uninterrupted run
    killed = cli(
        "train",
        cfg,
        *base_overrides(tiny_model_dir, arith_data, b, **common),
        env={**env, "HYBRIDRL_KILL_AFTER_SAVE_STEP": "2"},
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    resumed = cli("train", cfg, *base_overrides(tiny_model_dir, arith_data, b, **common), env=env)
    assert "at step 2/4" in resumed.stdout

    # the peak KV-cache use depends on when tool answers arrive (which sequences are paused
    # together), as rollout/extend_* do: a wall-clock effect, not the run's
    def same(row):
        return {k: v for k, v in without_volatile(row).items() if k != "rollout/kv_cache_usage"}

    for x, y in zip(metrics(a), metrics(b)):
        assert same(x) == same(y), f"step {x['step']} differs"
    wa, wb = weights(a / "checkpoints" / "step_4" / "actor"), weights(b / "checkpoints" / "step_4" / "actor")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_multi_turn_on_two_ray_workers(tiny_model_dir, arith_data, tmp_path):
    """The same multi-turn setup with the actor on 2 Ray worker processes (gloo, FSDP2): each
    worker runs its share of the trajectories through its own engine and agent loop."""
    (tmp_path / "teacher_env.py").write_text(TEACHER)
    (tmp_path / "reward.py").write_text(LAST_LINE_REWARD)
    (tmp_path / "interactions.yaml").write_text("interaction:\n  - name: teacher\n    class_name: teacher_env.RetryTeacher\n")
    overrides = {
        "actor_rollout_ref.model.random_init": "true",
        "data.max_response_length": 16,
        "actor_rollout_ref.rollout.multi_turn.enable": "true",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path": tmp_path / "interactions.yaml",
        "actor_rollout_ref.rollout.multi_turn.max_user_turns": 1,
        "custom_reward_function.path": tmp_path / "reward.py",
        "trainer.n_gpus_per_node": 2,
        "trainer.total_training_steps": 2,
        "trainer.test_freq": -1,
        "trainer.logger": "[console,jsonl]",
    }
    out = tmp_path / "run"
    run = cli(
        "train",
        _write_empty_yaml(tmp_path),
        *base_overrides(tiny_model_dir, arith_data, out, **overrides),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert "Ray, device cpu (colocated: 2 ranks)" in run.stdout
    train = [r for r in metrics(out) if r["step"] > 0]
    assert len(train) == 2
    assert_all_finite(train)
    assert max(r["agent/user_turns_mean"] for r in train) > 0 and max(r["agent/turns_mean"] for r in train) > 1
    assert min(r["reward/agent/mean"] for r in train) < 0
    assert max(r["training/rollout_probs_diff_max"] for r in train) < 1e-4


def test_multi_turn_config_errors(tiny_model_dir, arith_data, tmp_path):
    cfg = _write_empty_yaml(tmp_path)
    out = tmp_path / "run"
    bad = cli(
        "train",
        cfg,
        *base_overrides(tiny_model_dir, arith_data, out, **{"actor_rollout_ref.rollout.multi_turn.enable": "true"}),
        check=False,
    )
    assert bad.returncode != 0 and "needs tools or an interaction" in bad.stderr + bad.stdout
    bad = cli(
        "train",
        cfg,
        *base_overrides(
            tiny_model_dir,
            arith_data,
            out,
            **{
                "actor_rollout_ref.rollout.multi_turn.enable": "true",
                "actor_rollout_ref.rollout.multi_turn.tool_config_path": tmp_path / "missing.yaml",
                "actor_rollout_ref.rollout.name": "hf",
            },
        ),
        check=False,
    )
    text = bad.stderr + bad.stdout
    assert bad.returncode != 0 and "missing.yaml: no such file" in text and "set actor_rollout_ref.rollout.name=native" in text


def test_eval_runs_multi_turn_through_the_rollout_factory(tiny_model_with_weights, arith_data, tmp_path):
    """`hybridrl eval --interaction-config` builds its engine with `build_rollout`, as training does:
    rollout `auto` is the native engine on CPU for multi-turn, in the agent loop; the user's
    turns show in the summary's agent metrics."""
    import json

    (tmp_path / "teacher_env.py").write_text(TEACHER)
    (tmp_path / "interactions.yaml").write_text("interaction:\n  - name: teacher\n    class_name: teacher_env.RetryTeacher\n")
    summary = tmp_path / "summary.json"
    args = ["--model", tiny_model_with_weights, "--data", arith_data["test"], "--max-response-length", 16, "--limit", 4]
    args += ["--interaction-config", tmp_path / "interactions.yaml", "--summary", summary]
    ev = cli("eval", *args, env={"PYTHONPATH": str(tmp_path)})
    assert "arith: accuracy" in ev.stdout and "turns_mean" in ev.stdout
    rollout = json.loads(summary.read_text())["rollout"]
    assert rollout["agent/turns_mean"] >= 1 and "agent/user_turns_mean" in rollout
