import math

import numpy as np
import pytest
import torch

from hybridrl.algorithms import (
    ADV_ESTIMATORS,
    get_adv_estimator,
    masked_whiten,
    register_adv_estimator,
)

# Outcome rewards sit on the last valid token, as a reward manager writes them.
REWARDS_3 = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 5.0], [0.0, 0.0, 3.0]])
MASK_3 = torch.ones(3, 3)


def _grpo(rewards, mask, index, **kw):
    fn = get_adv_estimator("grpo")
    return fn(token_level_rewards=rewards, response_mask=mask, index=index, **kw)


# ---------------------------------------------------------------- GRPO


def test_grpo_hand_numbers_rows_in_any_order():
    # Group "a" = rows 0, 2 with scores 1, 3: mean 2, unbiased std sqrt(2) -> A = -+1/sqrt(2).
    # Group "b" = row 1 alone: mean 0, std 1 -> A = 5.
    adv, ret = _grpo(REWARDS_3, MASK_3, np.array(["a", "b", "a"]))
    s = 1 / math.sqrt(2)
    expected = torch.tensor([-s, 5.0, s])[:, None].expand(3, 3)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(ret, adv)


def test_grpo_accepts_int_ids_list_and_tensor():
    ref, _ = _grpo(REWARDS_3, MASK_3, np.array(["a", "b", "a"]))
    tuples = [("p", 1), ("p", 2), ("p", 1)]
    for index in (np.array([7, 3, 7]), [7, 3, 7], torch.tensor([7, 3, 7]), tuples):
        torch.testing.assert_close(_grpo(REWARDS_3, MASK_3, index)[0], ref)


def test_dr_grpo_does_not_divide_by_std():
    # Same groups: A = s - mean = -1, +1; the singleton keeps its score 5.
    adv, _ = _grpo(REWARDS_3, MASK_3, ["a", "b", "a"], norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1.0, 5.0, 1.0]))


def test_grpo_equal_rewards_give_zero_not_nan():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    adv, _ = _grpo(rewards, torch.ones(3, 2), [0, 0, 0])
    assert torch.equal(adv, torch.zeros(3, 2))


def test_grpo_padding_does_not_change_results():
    # Two extra padded tokens holding garbage rewards: valid tokens unchanged, padding is 0.
    rewards = torch.cat([REWARDS_3, torch.full((3, 2), 9.0)], dim=1)
    mask = torch.cat([MASK_3, torch.zeros(3, 2)], dim=1)
    ref, _ = _grpo(REWARDS_3, MASK_3, ["a", "b", "a"])
    adv, _ = _grpo(rewards, mask.bool(), ["a", "b", "a"])
    torch.testing.assert_close(adv[:, :3], ref)
    assert torch.equal(adv[:, 3:], torch.zeros(3, 2))


def test_grpo_needs_index():
    with pytest.raises(ValueError, match="index"):
        _grpo(REWARDS_3, MASK_3, None)


# ---------------------------------------------------------------- RLOO


def test_rloo_hand_numbers():
    # Group 0 = scores 1, 2, 6: baselines (2+6)/2=4, (1+6)/2=3.5, (1+2)/2=1.5 -> A = -3, -1.5, 4.5.
    # Group 1 = score 7 alone: no baseline -> A = 7.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 7.0], [2.0, 0.0], [0.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    adv, ret = get_adv_estimator("rloo")(token_level_rewards=rewards, response_mask=mask, index=["g", "h", "g", "g"])
    expected = torch.tensor([[-3.0, -3.0], [7.0, 7.0], [-1.5, 0.0], [4.5, 4.5]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, adv)


# ---------------------------------------------------------------- GAE


def _gae(rewards, values, mask, gamma, lam):
    return get_adv_estimator("gae")(token_level_rewards=rewards, response_mask=mask, values=values, gamma=gamma, lam=lam)


def test_gae_hand_numbers():
    # gamma = lam = 0.5, r = [0, 0, 1], V = 0.5 everywhere, V after the end = 0:
    #   t=2: delta = 1 + 0 - 0.5 = 0.5                A2 = 0.5
    #   t=1: delta = 0 + 0.25 - 0.5 = -0.25           A1 = -0.25 + 0.25 * 0.5 = -0.125
    #   t=0: delta = -0.25                            A0 = -0.25 + 0.25 * -0.125 = -0.28125
    # returns = A + V = [0.21875, 0.375, 1.0]; advantages = whiten(A).
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.full((1, 3), 0.5, dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    adv, ret = _gae(rewards, values, mask, 0.5, 0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.21875, 0.375, 1.0]], dtype=torch.float64))
    raw = torch.tensor([[-0.28125, -0.125, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(adv, masked_whiten(raw, mask))


def test_gae_masked_tokens_do_not_advance_the_recursion():
    # Same row as above with a padded token (garbage reward/value) inserted at t=1 and two at
    # the end: valid tokens must get exactly the compact row's results, padding gets 0.
    compact_r = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    compact_v = torch.tensor([[0.3, 0.5, 0.7]], dtype=torch.float64)
    r = torch.tensor([[0.0, 9.0, 0.0, 1.0, 9.0, 9.0]], dtype=torch.float64)
    v = torch.tensor([[0.3, 9.0, 0.5, 0.7, 9.0, 9.0]], dtype=torch.float64)
    m = torch.tensor([[1, 0, 1, 1, 0, 0]], dtype=torch.bool)
    ref_adv, ref_ret = _gae(compact_r, compact_v, torch.ones(1, 3, dtype=torch.float64), 0.9, 0.8)
    adv, ret = _gae(r, v, m, 0.9, 0.8)
    torch.testing.assert_close(adv[m], ref_adv.flatten())
    torch.testing.assert_close(ret[m], ref_ret.flatten())
    assert torch.equal(adv[~m], torch.zeros(3, dtype=torch.float64))
    assert torch.equal(ret[~m], torch.zeros(3, dtype=torch.float64))


def _naive_gae(rewards, values, mask, gamma, lam):
    """Per-row python loop over the valid tokens only, then whiten over all valid tokens."""
    raw = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        pos = np.nonzero(mask[i])[0]
        last_adv, next_v = 0.0, 0.0
        for t in pos[::-1]:
            last_adv = rewards[i, t] + gamma * next_v - values[i, t] + gamma * lam * last_adv
            next_v = values[i, t]
            raw[i, t] = last_adv
    valid = raw[mask.astype(bool)]
    whitened = (raw - valid.mean()) / math.sqrt(valid.var(ddof=1) + 1e-8)
    return whitened * mask, (raw + values) * mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_naive_float64_reference(seed):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 11
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).to(torch.float64)  # holes anywhere
    mask[:, 0] = 1
    adv, ret = _gae(rewards, values, mask, 0.97, 0.9)
    ref_adv, ref_ret = _naive_gae(rewards.numpy(), values.numpy(), mask.numpy(), 0.97, 0.9)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- REINFORCE++ and ReMax


def test_reinforce_plus_plus_hand_numbers_and_padding():
    # gamma = 0.5, r = [1, 0, 2]: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5.
    # Whiten [1.5, 1, 2]: mean 1.5, unbiased var (0 + .25 + .25)/2 = .25 -> [0, -1, 1].
    # Two padded tokens with reward 9 must not leak into G.
    r = torch.tensor([[1.0, 0.0, 2.0, 9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    fn = get_adv_estimator("reinforce_plus_plus")
    adv, ret = fn(token_level_rewards=r, response_mask=m, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[1.5, 1.0, 2.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.0, -1.0, 1.0, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_remax_hand_numbers():
    # Masked rewards [0, 1, (2 padded)] -> reverse cumsum [1, 1, 0];
    # baseline 0.5 -> A = [.5, .5, 0].
    r = torch.tensor([[0.0, 1.0, 2.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    adv, ret = get_adv_estimator("remax")(token_level_rewards=r, response_mask=m, reward_baselines=torch.tensor([0.5]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0]]))


# ---------------------------------------------------------------- registry


def test_every_estimator_takes_the_full_signature():
    B, T = 4, 5
    mask = torch.ones(B, T)
    mask[:, 3:] = 0
    kwargs = dict(
        token_level_rewards=torch.randn(B, T),
        response_mask=mask,
        index=np.array(["x", "y", "x", "y"], dtype=object),
        values=torch.randn(B, T),
        reward_baselines=torch.randn(B),
        gamma=0.99,
        lam=0.95,
        norm_adv_by_std_in_grpo=True,
        epsilon=1e-6,
    )
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "remax"} <= set(ADV_ESTIMATORS)
    for name, fn in ADV_ESTIMATORS.items():
        adv, ret = fn(**kwargs)
        assert adv.shape == ret.shape == (B, T), name
        assert torch.isfinite(adv).all() and torch.isfinite(ret).all(), name
        assert torch.equal(adv[:, 3:], torch.zeros(B, 2)), name
        assert not adv.requires_grad, name


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ValueError, match="grpo"):
        get_adv_estimator("no_such_estimator")


def test_register_custom_estimator_and_refuse_duplicates():
    @register_adv_estimator("test_zero")
    def zero(*, token_level_rewards, response_mask, **_):
        return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)

    try:
        assert get_adv_estimator("test_zero") is zero
        with pytest.raises(ValueError, match="already registered"):
            register_adv_estimator("test_zero")(lambda **_: None)
    finally:
        del ADV_ESTIMATORS["test_zero"]
