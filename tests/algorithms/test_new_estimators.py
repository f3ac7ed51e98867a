"""reinforce_plus_plus_baseline, opo, gpg, grpo_passk against numbers worked out by hand (float64)."""

import math

import pytest
import torch

from hybridrl.algorithms import get_adv_estimator

D = torch.float64


def outcome(scores, lengths, width):
    """Rewards with each score on its response's last token, and the response mask."""
    mask = torch.zeros(len(scores), width, dtype=D)
    rewards = torch.zeros(len(scores), width, dtype=D)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def run(name, scores, lengths, index, width=3, **kw):
    rewards, mask = outcome(scores, lengths, width)
    adv, ret = get_adv_estimator(name)(token_level_rewards=rewards, response_mask=mask, index=index, **kw)
    assert torch.equal(adv, ret)
    assert torch.all(adv[mask == 0] == 0)
    return adv, mask


def per_row(adv, mask):
    """The value each row carries on its tokens (they are all equal)."""
    rows = []
    for a, m in zip(adv, mask):
        vals = a[m > 0]
        assert torch.allclose(vals, vals[0].expand_as(vals))
        rows.append(vals[0].item())
    return rows


def test_reinforce_plus_plus_baseline_subtracts_the_group_mean_then_whitens_over_tokens():
    # groups a: [1, 0] -> [0.5, -0.5]; b: one sample -> baseline 0 -> 3. Tokens: 1, 2 and 1 of them.
    # token values [0.5, -0.5, -0.5, 3]: mean 0.625, unbiased var = sum((x - 0.625)^2) / 3
    adv, mask = run("reinforce_plus_plus_baseline", [1, 0, 3], [1, 2, 1], ["a", "a", "b"])
    tokens = [0.5, -0.5, -0.5, 3.0]
    mean = sum(tokens) / 4
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / 3 + 1e-8)
    assert per_row(adv, mask) == pytest.approx([(0.5 - mean) / std, (-0.5 - mean) / std, (3 - mean) / std])


def test_opo_baseline_is_the_length_weighted_group_mean():
    # group a: scores [1, 0, 1], lengths [1, 2, 3] -> b = (1*1 + 2*0 + 3*1) / 6 = 2/3; group b alone -> 0
    adv, mask = run("opo", [1, 0, 1, 5], [1, 2, 3, 1], ["a", "a", "a", "b"])
    assert per_row(adv, mask) == pytest.approx([1 / 3, -2 / 3, 1 / 3, 5])


def test_gpg_scales_by_batch_over_nonzero_scores_and_does_not_divide_by_std():
    # 4 samples, 1 non-zero score -> alpha = 4; group a mean 0.5, group b mean 0
    adv, mask = run("gpg", [1, 0, 0, 0], [1, 1, 2, 3], ["a", "a", "b", "b"])
    assert per_row(adv, mask) == pytest.approx([2, -2, 0, 0])
    adv, mask = run("gpg", [0, 0], [1, 1], ["a", "a"])  # nothing rewarded: alpha = 2 / 1, advantages 0
    assert per_row(adv, mask) == [0, 0]


def test_grpo_passk_gives_only_the_best_sample_the_gap_to_the_second():
    # a: [1, 3, 2] -> row 1 gets (3 - 2) / (std 1 + eps); b: [0, 4] -> row 4 gets 4 / (sqrt(8) + eps)
    index = ["a", "a", "a", "b", "b"]
    adv, mask = run("grpo_passk", [1, 3, 2, 0, 4], [1, 2, 3, 1, 1], index)
    assert per_row(adv, mask) == pytest.approx([0, 1 / (1 + 1e-6), 0, 0, 4 / (math.sqrt(8) + 1e-6)])
    adv, mask = run("grpo_passk", [1, 3, 2, 0, 4], [1, 2, 3, 1, 1], index, norm_adv_by_std_in_grpo=False)
    assert per_row(adv, mask) == pytest.approx([0, 1, 0, 0, 4])
    adv, mask = run("grpo_passk", [3, 3], [1, 1], ["a", "a"])  # a tie: the gap is 0
    assert per_row(adv, mask) == [0, 0]


def test_grpo_passk_refuses_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2 samples per prompt.*rollout.n >= 2"):
        run("grpo_passk", [1, 0], [1, 1], ["a", "b"])
