"""The RL step's reward stage (hybridrl/rewards/stage.py), by hand: the rule score shaped by the agent
reward and the overlong penalty, combined with the reward model's by the weights, written once on the
last token the model sampled; the same numbers whether scored at once, in the background, or handed
over by DAPO's filter."""

from __future__ import annotations

import doctest
from types import SimpleNamespace

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rewards import ScoreResult, stage
from hybridrl.rewards.pool import WorkerPool
from hybridrl.rewards.scorer import FunctionScorer, Pending, Scorer
from hybridrl.rewards.stage import EarlyScores, RewardStage
from hybridrl.tracking.timer import StageTimer


def exact(data_source, solution_str, ground_truth, extra_info):
    return {"score": float(solution_str == ground_truth), "length": len(solution_str)}


class FixedModel(Scorer):
    """A reward model whose scores are 2 and 4, with one unparsable verdict (a judge's metric)."""

    name = "the reward model"

    def __init__(self):
        self.batches = []

    def submit(self, inputs):
        self.batches.append(inputs.batch)
        return Pending(lambda: ScoreResult([2.0, 4.0], metrics={"judge_parse_errors": 1.0}))


def generated() -> Batch:
    """Two responses of 3 sampled tokens in a width of 4; row 1 has a tool token between its own
    (multi-turn), so its last sampled token is column 3."""
    return Batch(
        {
            K.RESPONSE_MASK: torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]], dtype=torch.float32),
            K.AGENT_REWARD: torch.tensor([0.5, -1.0]),
        },
        {
            K.DATA_SOURCE: ["x", "x"],
            K.RESPONSE_TEXT: ["4", "5"],
            K.GROUND_TRUTH: ["4", "4"],
            K.EXTRA_INFO: [None, None],
        },
    )


def reward_stage(defer=False, model=None) -> RewardStage:
    overlong = SimpleNamespace(len=2, penalty_factor=1.0, log=True)  # expected 2 tokens: 3 cost -0.5
    scorer = FunctionScorer(WorkerPool(exact, kind="thread"))
    return RewardStage(scorer, model, defer=defer, agent=True, overlong=overlong, max_response_length=4, weights=(0.5, 2.0))


def test_doctests():
    assert doctest.testmod(stage).failed == 0


@pytest.mark.parametrize("defer", [False, True], ids=["now", "in-the-background"])
def test_the_step_score_is_weighted_rm_plus_shaped_rule_on_the_last_sampled_token(defer):
    model, batch, timer = FixedModel(), generated(), StageTimer()
    reward = reward_stage(defer, model)
    pending = reward.start(batch, EarlyScores(), timer)
    assert K.TOKEN_LEVEL_SCORES not in batch and model.batches == [batch]  # submitted, not written
    metrics = reward.finish(batch, pending, timer)
    # rule: exact [1, 0] + agent [0.5, -1] + overlong [-0.5, -0.5] = [1, -1.5]
    # step: 0.5 x RM [2, 4] + 2 x rule = [3, -1]
    want = torch.tensor([[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, -1.0]])
    torch.testing.assert_close(batch[K.TOKEN_LEVEL_SCORES], want, rtol=0, atol=0)
    torch.testing.assert_close(batch[K.RM_SCORES], torch.tensor([2.0, 4.0]), rtol=0, atol=0)
    assert metrics["reward_model/rule_score/mean"] == -0.25 and metrics["reward_model/score/mean"] == 3.0
    assert metrics["reward_model/judge_parse_errors"] == 1.0 and metrics["reward/agent/mean"] == -0.25
    assert metrics["reward/overlong_reward/mean"] == -0.5 and metrics["reward/overlong/mean"] == 1.0
    assert metrics["reward/length/mean"] == 1.0 and metrics["reward/errors"] == 0
    assert ("reward/score_s" in metrics) == defer
    assert {"timing_s/reward", "timing_s/reward_model"} <= set(timer.metrics())
    reward.scorer.close()


def test_without_a_reward_model_the_shaped_rule_score_is_the_step_score():
    batch, timer = generated(), StageTimer()
    reward = reward_stage()
    scores = reward.score(batch)
    assert scores.raw.tolist() == [1.0, 0.0] and scores.values.tolist() == [1.0, -1.5]
    assert scores.extras["acc"] == [1.5, -1.0]  # with the overlong penalty: the score before it
    metrics = reward.finish(batch, reward.start(batch, EarlyScores(scores=scores.take([0, 1])), timer), timer)
    torch.testing.assert_close(batch[K.TOKEN_LEVEL_SCORES], torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, -1.5]]), rtol=0, atol=0)
    assert not any(k.startswith("reward_model/") for k in metrics) and K.RM_SCORES not in batch
    reward.scorer.close()


def test_scores_follow_the_rows_dapo_keeps():
    reward = reward_stage()
    a = reward.score(generated())
    b = reward.score(generated())
    joined = stage.Scores.concat([a.take([1]), b.take([0, 1])])
    assert joined.values.tolist() == [-1.5, 1.0, -1.5] and joined.extras["length"] == [1.0, 1.0, 1.0]
    reward.scorer.close()
