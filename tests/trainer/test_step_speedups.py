"""Options that shorten the RL step without changing it: reward_model.launch_reward_fn_async (the
scores computed in a background thread while the log-prob passes run: the same scores) and
actor.reuse_on_policy_log_prob over several mini-batches, end to end."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import torch

from hybridrl.config import config_from_dict
from hybridrl.config.validate import config_notices
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rewards.pool import WorkerPool
from hybridrl.rewards.scorer import FunctionScorer, Scorer
from hybridrl.rewards.stage import RewardStage
from hybridrl.rollout import SamplingParams
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.dynamic_sampling import RolloutSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))


def cfg_with(**reward_model):
    return config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 2, "max_response_length": 3},
            "actor_rollout_ref": {"model": {"path": "unused"}, "actor": {"ppo_mini_batch_size": 2}, "rollout": {"n": 2}},
            "reward_model": reward_model,
            "trainer": {"device": "cpu"},
        }
    )


class FixedActor:
    """`generate` returns a ready batch: 4 responses, the texts '0'..'3'."""

    def generate(self, prompts, sampling):
        b = 4
        return Batch(
            {
                K.PROMPTS: torch.ones(b, 2, dtype=torch.long),
                K.PROMPT_MASK: torch.ones(b, 2, dtype=torch.long),
                K.RESPONSES: torch.ones(b, 3, dtype=torch.long),
                K.RESPONSE_MASK: torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.float32),
            },
            {
                K.DATA_SOURCE: ["x"] * b,
                K.GROUND_TRUTH: ["2"] * b,
                K.EXTRA_INFO: [{}] * b,
                K.RESPONSE_TEXT: [str(i) for i in range(b)],
                K.UID: ["a", "a", "b", "b"],
            },
            {K.PAD_TOKEN_ID: 0},
        )


def test_scores_are_computed_in_the_background_and_joined():
    """The reward function blocks until the test, after `start` returned, lets it go: `start`
    did not wait for it. `finish` then writes the scores on each response's last token."""
    release, started = threading.Event(), threading.Event()

    def blocking_score(data_source, solution_str, ground_truth, extra_info):
        started.set()
        if not release.wait(timeout=30):
            raise TimeoutError("sample() waited for the scores")
        return float(solution_str == ground_truth) + 0.1 * int(solution_str)

    cfg = cfg_with(launch_reward_fn_async=True)
    reward = RewardStage.from_config(cfg, FunctionScorer(WorkerPool(blocking_score, kind="thread", timeout_s=60)))
    sampler = RolloutSampler(cfg, FixedActor(), reward, SamplingParams(n=2, max_new_tokens=3), None)
    timer = StageTimer()
    batch, _, _, early = sampler.sample(Batch({}), timer)
    pending = reward.start(batch, early, timer)
    assert K.TOKEN_LEVEL_SCORES not in batch
    assert started.wait(timeout=30)  # scoring is under way in its thread
    batch[K.OLD_LOG_PROBS] = torch.zeros(4, 3)  # the step goes on meanwhile
    release.set()
    metrics = reward.finish(batch, pending, timer)
    want = torch.tensor([[0, 0, 0.0], [0.1, 0, 0], [0, 1.2, 0], [0, 0, 0.3]])
    torch.testing.assert_close(batch[K.TOKEN_LEVEL_SCORES], want)
    assert metrics["reward/errors"] == 0 and metrics["reward/score_s"] > 0
    assert "timing_s/reward" in timer.metrics()


class Broken(Scorer):
    def submit(self, inputs):
        raise RuntimeError("scorer crashed")


def test_a_failing_scorer_is_raised_at_the_join():
    """A scorer that fails as a whole (not one sample's call, which scores 0 and is counted) raises
    in the step, at the join, with its own message."""
    reward = RewardStage.from_config(cfg_with(launch_reward_fn_async=True), Broken())
    sampler = RolloutSampler(cfg_with(), FixedActor(), reward, SamplingParams(n=2, max_new_tokens=3), None)
    batch, _, _, early = sampler.sample(Batch({}), StageTimer())
    pending = reward.start(batch, early, StageTimer())
    with pytest.raises(RuntimeError, match="scorer crashed"):
        reward.finish(batch, pending, StageTimer())


def test_filter_groups_and_async_modes_score_in_the_foreground_with_a_notice():
    cfg = cfg_with(launch_reward_fn_async=True)
    cfg.algorithm.filter_groups.enable = True
    assert RewardStage.from_config(cfg, Broken()).defer is False
    assert RewardStage.from_config(cfg_with(launch_reward_fn_async=True), Broken()).defer is True
    assert any("launch_reward_fn_async" in n and "filter_groups" in n for n in config_notices(cfg))
    cfg = cfg_with(launch_reward_fn_async=True)
    cfg.trainer.mode = "one_step_off"
    assert any("launch_reward_fn_async" in n and "one_step_off" in n for n in config_notices(cfg))
    assert not any("launch_reward_fn_async" in n for n in config_notices(cfg_with(launch_reward_fn_async=True)))


def test_a_run_with_deferred_scores_logs_the_same_metrics(tiny_model_dir, arith_data, tmp_path):
    """The CLI, GRPO with the KL loss, 3 steps, the native engine in-process: every response is
    scored as it ends, during generation (hybridrl/rewards/stream.py), and every metric but
    wall-clock ones is identical to scoring after generation."""
    from cli_helpers import cli, metrics, without_volatile
    from test_cli import base_overrides

    reward = tmp_path / "reward.py"  # a custom reward file: scored in worker processes, the case that streams
    reward.write_text(
        "from hybridrl.rewards import default_compute_score\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return default_compute_score(data_source, solution_str, ground_truth, extra_info)\n"
    )
    rows = {}
    for deferred in (False, True):
        out = tmp_path / str(deferred)
        cli(
            "train",
            "configs/quickstart.yaml",
            *base_overrides(tiny_model_dir, arith_data, out, **{"actor_rollout_ref.model.random_init": "true"}),
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.rollout.name=native",
            f"custom_reward_function.path={reward}",
            "trainer.logger=[jsonl]",
            f"reward_model.launch_reward_fn_async={str(deferred).lower()}",
            "warmup.steps=0",
            cwd=Path(__file__).resolve().parents[2],
        )
        rows[deferred] = [without_volatile(r) for r in metrics(out)]
    steps = [r for r in rows[True] if "critic/score/mean" in r]
    assert all("reward/score_s" in r for r in steps)
    assert [r["reward/streamed_fraction"] for r in steps] == [1.0] * 3  # all scored while generating
    stripped = [{k: v for k, v in r.items() if k not in ("reward/score_s", "reward/streamed_fraction")} for r in rows[True]]
    assert stripped == rows[False]
    assert any("critic/score/mean" in r for r in rows[False])


def test_a_run_reusing_pi_old_over_two_mini_batches(tiny_model_dir, arith_data, tmp_path):
    """actor.reuse_on_policy_log_prob with two mini-batches per step: no old log-prob stage, the
    update trains (finite metrics, a non-zero gradient), and the engine/trainer comparison is logged."""
    from cli_helpers import assert_all_finite, cli, metrics
    from test_cli import base_overrides

    out = tmp_path / "run"
    cli(
        "train",
        "configs/quickstart.yaml",
        *base_overrides(tiny_model_dir, arith_data, out, **{"actor_rollout_ref.model.random_init": "true"}),
        "actor_rollout_ref.actor.reuse_on_policy_log_prob=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "trainer.logger=[jsonl]",
        "warmup.steps=0",
        cwd=Path(__file__).resolve().parents[2],
    )
    rows = [r for r in metrics(out) if "actor/pg_loss" in r]
    assert len(rows) == 3
    assert_all_finite(rows)
    assert all("timing_s/old_log_prob" not in r or r["timing_s/old_log_prob"] < 1e-3 for r in rows)
    assert all(r["actor/grad_norm"] > 0 and "training/rollout_probs_diff_mean" in r for r in rows)
