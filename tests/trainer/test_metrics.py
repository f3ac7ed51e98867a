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


def test_group_signal_shares_match_a_count_by_hand_on_random_groups():
    """critic/groups/*: for fresh random groups (sizes 1-6, scores from a few levels so that uniform groups
    occur), the shares equal a direct count; float noise in a score (0.2 stored as 0.20000000298) does not
    split a group; prompts of one sample never count."""
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    for _ in range(20):
        n_groups = int(torch.randint(1, 30, (1,), generator=g))
        uids, scores, want_uniform, want_top = [], [], 0, 0
        levels = torch.tensor([0.0, 0.1, 0.2, 1.0])
        per_group = []
        for j in range(n_groups):
            size = int(torch.randint(1, 7, (1,), generator=g))
            s = levels[torch.randint(0, 4, (1 if torch.rand(1, generator=g) < 0.5 else size,), generator=g)]
            s = s.expand(size).clone() if s.numel() == 1 else s
            uids += [f"p{j}"] * size
            per_group.append(s.tolist())
            scores.append(s)
        x = torch.cat(scores)
        noisy = x + 3e-9 * torch.rand(x.shape, generator=g)  # float32 storage noise, far below any real gap
        top = max(max(s) for s in per_group)
        counted = [s for s in per_group if len(s) > 1]
        for s in counted:
            want_uniform += len(set(s)) == 1
            want_top += len(set(s)) == 1 and s[0] == top
        # shuffle the rows: groups need not be contiguous in a batch
        perm = torch.randperm(len(uids), generator=g)
        b = _batch()
        got = compute_data_metrics_of(b, [uids[i] for i in perm], noisy[perm])
        if not counted:
            assert "critic/groups/no_signal_frac" not in got
            continue
        assert got["critic/groups/no_signal_frac"] == pytest.approx(want_uniform / len(counted))
        assert got["critic/groups/all_top_frac"] == pytest.approx(want_top / len(counted))


def compute_data_metrics_of(template: Batch, uids: list, seq_scores: torch.Tensor) -> dict:
    """compute_data_metrics on a batch of len(uids) one-token responses scoring seq_scores."""
    n = len(uids)
    t = {k: template[k][:1].expand(n, -1).clone() for k in template.tensors}
    t[K.TOKEN_LEVEL_SCORES] = torch.zeros(n, 4)
    t[K.TOKEN_LEVEL_SCORES][:, 0] = seq_scores
    b = Batch(t)
    b[K.UID] = uids
    return compute_data_metrics(b, max_response_length=4)


def test_ppo_with_one_sample_a_prompt_logs_no_group_shares():
    b = _batch()
    b[K.UID] = ["p0", "p1"]
    assert not any(k.startswith("critic/groups/") for k in compute_data_metrics(b, max_response_length=4))
    b[K.UID] = ["p0", "p0"]  # one group of two: scores 1.0 and 0.0 differ
    got = compute_data_metrics(b, max_response_length=4)
    assert got["critic/groups/no_signal_frac"] == 0.0 and got["critic/groups/all_top_frac"] == 0.0
