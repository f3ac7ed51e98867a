import math

import pytest
import torch

from hybridrl.algorithms import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_value_loss,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 is empty


# ---------------------------------------------------------------- agg_loss


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 seqs
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 seqs
        ("seq-mean-token-sum-norm", 7 / 6),  # 7 / (2 seqs * T=3)
    ],
)
def test_agg_loss_hand_numbers(mode, expected):
    out = agg_loss(LOSS[:2], MASK[:2], mode)
    assert out.item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),
        ("seq-mean-token-sum", 7 / 3),  # (3 + 4 + 0) / 3 seqs
        ("seq-mean-token-mean", 11 / 6),  # (1.5 + 4 + 0) / 3 seqs, no 0/0
        ("seq-mean-token-sum-norm", 7 / 9),  # 7 / (3 * 3)
    ],
)
def test_agg_loss_empty_row_counts_as_a_sequence_without_nan(mode, expected):
    assert agg_loss(LOSS, MASK.bool(), mode).item() == pytest.approx(expected)


def test_agg_loss_all_padding_is_zero():
    for mode in LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros(3, 3), mode).item() == 0.0


def test_agg_loss_unknown_mode_lists_modes():
    with pytest.raises(ValueError, match="token-mean"):
        agg_loss(LOSS, MASK, "token-median")


def _random_batch(seed, B=14, T=9):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[3] = 0  # at least one empty response
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)  # (B, T) right-padded
    return loss, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("n_micro", [1, 3, 7])
def test_micro_batch_sum_equals_whole_batch_value_and_grad(mode, n_micro):
    loss, mask = _random_batch(seed=n_micro)
    whole_in = loss.clone().requires_grad_(True)
    whole = agg_loss(whole_in, mask, mode)
    whole.backward()

    split_in = loss.clone().requires_grad_(True)
    global_tokens, global_seqs = mask.sum(), mask.shape[0]
    total = sum(
        agg_loss(l, m, mode, global_tokens=global_tokens, global_seqs=global_seqs)
        for l, m in zip(torch.tensor_split(split_in, n_micro), torch.tensor_split(mask, n_micro))
    )
    total.backward()

    torch.testing.assert_close(total, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(split_in.grad, whole_in.grad, rtol=1e-12, atol=1e-12)


def test_entropy_loss_is_agg_of_entropy():
    for mode in LOSS_AGG_MODES:
        expected = agg_loss(LOSS, MASK, mode)
        torch.testing.assert_close(compute_entropy_loss(LOSS, MASK, mode), expected)


# ---------------------------------------------------------------- policy loss


def _policy(ratios, advantages, mask=None, **kw):
    ratios = torch.tensor([ratios], dtype=torch.float64)
    log_prob = ratios.log().requires_grad_(True)
    out = compute_policy_loss(
        old_log_prob=torch.zeros_like(ratios),
        log_prob=log_prob,
        advantages=torch.tensor([advantages], dtype=torch.float64),
        response_mask=torch.ones_like(ratios) if mask is None else torch.tensor([mask]),
        **{"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, **kw},
    )
    return out, log_prob


def test_policy_loss_clipping_cases():
    # Token  A   r    -A r   -A clip(r,.8,1.2)  max    dual -A*3  final  active
    #  a    +1  1.5   -1.5   -1.2               -1.2   -          -1.2   clip   (grad 0)
    #  b    +1  0.5   -0.5   -0.8               -0.5   -          -0.5   none   (grad -A r = -0.5)
    #  c    -1  5.0    5.0    1.2                5.0   3          3.0    dual   (grad 0)
    #  d    -1  0.5    0.5    0.8                0.8   3          0.8    clip   (grad 0)
    # token-mean = (-1.2 - 0.5 + 3 + 0.8) / 4 = 0.525
    out, log_prob = _policy([1.5, 0.5, 5.0, 0.5], [1.0, 1.0, -1.0, -1.0])
    assert out["pg_loss"].item() == pytest.approx(0.525)
    assert out["pg_clipfrac"].item() == pytest.approx(0.5)  # a, d
    assert out["pg_clipfrac_lower"].item() == pytest.approx(0.25)  # c
    assert out["ppo_kl"].item() == pytest.approx(-math.log(1.5 * 0.5 * 5.0 * 0.5) / 4)
    out["pg_loss"].backward()
    expected_grad = torch.tensor([[0.0, -0.5 / 4, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(log_prob.grad, expected_grad)
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"):
        assert out[key].dim() == 0 and not out[key].requires_grad


def test_policy_loss_asymmetric_clip_higher():
    # A = +1, bounds [0.8, 1.28].  r = 1.5: max(-1.5, -1.28) = -1.28 (clipped).
    # r = 0.7: max(-0.7, -0.8) = -0.7, the unclipped term stays (PPO is pessimistic).
    out, _ = _policy([1.5, 0.7], [1.0, 1.0], clip_ratio_high=0.28)
    assert out["pg_loss"].item() == pytest.approx((-1.28 - 0.7) / 2)
    assert out["pg_clipfrac"].item() == pytest.approx(0.5)


def test_policy_loss_ignores_padding():
    ref, _ = _policy([1.5, 0.5], [1.0, -1.0])
    out, _ = _policy([1.5, 0.5, 1e6], [1.0, -1.0, -50.0], mask=[1.0, 1.0, 0.0])
    for key in ref:
        assert out[key].item() == pytest.approx(ref[key].item())


def test_policy_loss_rejects_dual_clip_c_at_most_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        _policy([1.0], [1.0], clip_ratio_c=1.0)


# ---------------------------------------------------------------- value loss


def test_value_loss_hand_numbers():
    # c = 0.2.  Token 1: V 1.5, V_old 1.0, R 2.0 -> V_clip 1.2; errors .25, .64 -> .64 (clipped)
    #           Token 2: V 0.1, V_old 0.0, R 1.0 -> V_clip 0.1; errors .81, .81 -> .81
    # vf_loss = 0.5 * (.64 + .81) / 2 = 0.3625; clipfrac = 1/2.  Token 3 is padding.
    vpreds = torch.tensor([[1.5, 0.1, 50.0]], requires_grad=True)
    out = compute_value_loss(
        vpreds=vpreds,
        values=torch.tensor([[1.0, 0.0, 0.0]]),
        returns=torch.tensor([[2.0, 1.0, 0.0]]),
        response_mask=torch.tensor([[1.0, 1.0, 0.0]]),
        cliprange_value=0.2,
    )
    assert out["vf_loss"].item() == pytest.approx(0.3625)
    assert out["vf_clipfrac"].item() == pytest.approx(0.5)
    out["vf_loss"].backward()
    # Token 1's active term is clipped (no grad); token 2: 0.5 * 2 (V - R) / 2 = -0.45.
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, -0.45, 0.0]]))
