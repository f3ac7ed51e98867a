"""The batch statistics of a step (hybridrl/trainer/metrics.py) on a batch worked out by hand: every
key and value, so a metric computed from the wrong tensor (the engine's log-probs in place of the
trainer's) or dropped shows here."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.trainer.metrics import compute_data_metrics


def _batch() -> Batch:
    # two responses of 3 and 1 tokens (R = 4); the masked positions hold values that must not count
    b = Batch(
        {
            K.RESPONSE_MASK: torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]]),
            K.PROMPT_MASK: torch.tensor([[1, 1], [0, 1]]),
            K.TOKEN_LEVEL_SCORES: torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
            K.TOKEN_LEVEL_REWARDS: torch.tensor([[0.0, 0.0, 0.5, 0.0], [-0.5, 0.0, 0.0, 0.0]]),
            K.ADVANTAGES: torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0]]),
            K.RETURNS: torch.tensor([[0.5, 0.5, 0.5, 7.0], [-1.0, 7.0, 7.0, 7.0]]),
            # the trainer finds token 2 of row 0 improbable (p = e^-20 < 1e-6); the engine that
            # sampled it gave it p = 0.25 (the mismatch the metric exists to show)
            K.OLD_LOG_PROBS: torch.tensor([[-1.0, -20.0, -1.0, -30.0], [-1.0, -30.0, -30.0, -30.0]]),
            K.ROLLOUT_LOG_PROBS: torch.tensor([[-1.0, math.log(0.25), -1.0, -30.0], [-1.0, -30.0, -30.0, -30.0]]),
        }
    )
    b[K.DATA_SOURCE] = ["a", "b"]
    return b


def test_every_metric_of_a_hand_worked_batch():
    diff = 0.25 - math.exp(-20)  # |p_engine - p_trainer| of the one mismatched token
    want = {
        "critic/score/mean": 0.5, "critic/score/max": 1.0, "critic/score/min": 0.0,
        "critic/score/a/mean": 1.0, "critic/score/b/mean": 0.0,
        "critic/rewards/mean": 0.0, "critic/rewards/max": 0.5, "critic/rewards/min": -0.5,
        "critic/advantages/mean": 2.5, "critic/advantages/max": 4.0, "critic/advantages/min": 1.0,
        "critic/returns/mean": 0.125, "critic/returns/max": 0.5, "critic/returns/min": -1.0,
        "response_length/mean": 2.0, "response_length/max": 3.0, "response_length/min": 1.0,
        "response_length/clip_ratio": 0.0,
        "prompt_length/mean": 1.5, "prompt_length/max": 2.0, "prompt_length/min": 1.0,
        "perf/total_num_tokens": 7.0,
        "training/rollout_probs_diff_mean": diff / 4, "training/rollout_probs_diff_max": diff,
        "rollout/improbable_token_frac": 0.25,  # 1 of 4 response tokens, by the trainer's log-probs
    }  # fmt: skip
    got = compute_data_metrics(_batch(), max_response_length=4)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert compute_data_metrics(_batch(), max_response_length=3)["response_length/clip_ratio"] == 0.5


def test_without_the_old_log_prob_pass_the_update_reports_the_rollout_metrics():
    """actor.reuse_on_policy_log_prob: no OLD_LOG_PROBS, so no trainer-vs-engine numbers here."""
    b = _batch()
    b = b.select([k for k in b.tensors if k != K.OLD_LOG_PROBS])
    got = compute_data_metrics(b, max_response_length=4)
    assert not any(k.startswith(("training/rollout_probs", "rollout/improbable")) for k in got)
