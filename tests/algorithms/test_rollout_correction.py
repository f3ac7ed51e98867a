"""Train/rollout mismatch correction against numbers worked out by hand (float64)."""

import math

import pytest
import torch

from hybridrl.algorithms.rollout_correction import compute_rollout_correction, parse_rs_thresholds

D = torch.float64
LN = math.log


def correct(log_ratio, mask, **kw):
    """old = log_ratio, rollout = 0: the ratio pi_old / pi_rollout is exp(log_ratio)."""
    lr, m = torch.tensor(log_ratio, dtype=D), torch.tensor(mask, dtype=D)
    return compute_rollout_correction(old_log_prob=lr, rollout_log_prob=torch.zeros_like(lr), response_mask=m, **kw)


def test_token_level_weights_are_truncated_ratios_with_verl_metrics():
    # ratios 3, 0.25, 1 -> weights min(r, 2) = 2, 0.25, 1
    weights, mask, m = correct([[LN(3), LN(0.25), 0.0]], [[1, 1, 1]], rollout_is="token", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.25, 1.0]], dtype=D))
    assert torch.equal(mask, torch.ones(1, 3, dtype=D))  # no rejection asked for
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(4.25 / 3)  # before truncation
    assert (m["rollout_corr/rollout_is_max"], m["rollout_corr/rollout_is_min"]) == pytest.approx((3, 0.25))
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # 3 > 2
    assert m["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 0.25 < 1/2
    # ESS: weights clamped to [0.5, 2] = [2, 0.5, 1]; mean(c)^2 / mean(c^2) = (3.5/3)^2 / (5.25/3)
    assert m["rollout_corr/rollout_is_eff_sample_size"] == pytest.approx((3.5 / 3) ** 2 / 1.75, rel=1e-6)
    assert not weights.requires_grad


def test_sequence_level_weights_are_the_product_over_the_sequence_and_can_be_batch_normalised():
    # row 0: 2 * 0.75 = 1.5 on both tokens; row 1: 4 (its padding's 5.0 ignored) -> truncated to 2
    lr, mask = [[LN(2), LN(0.75)], [LN(4), 5.0]], [[1, 1], [1, 0]]
    weights, _, m = correct(lr, mask, rollout_is="sequence", rollout_is_threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.5, 1.5], [2.0, 0.0]], dtype=D))
    assert m["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # one sequence of two
    normed, _, m = correct(lr, mask, rollout_is="sequence", rollout_is_threshold=2.0, rollout_is_batch_normalize=True)
    torch.testing.assert_close(normed, torch.tensor([[1.5, 1.5], [2.0, 0.0]], dtype=D) / 1.75)  # mean of (1.5, 2)
    assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.75)


@pytest.mark.parametrize(
    "rs, threshold, keep",
    [
        # k1 = log(pi_rollout / pi_old) = [-ln 3, ln 4, 0 | -ln 2.5, 0]; [0.5, 2] keeps only the ratio-1 tokens
        ("token_k1", "0.5_2", [[0, 0, 1], [0, 1, 0]]),
        ("token_k1", 2.0, [[0, 0, 1], [0, 1, 0]]),  # one number u means [1/u, u]
        # k2 = lr^2 / 2: (ln 3)^2/2 = 0.60, (ln 4)^2/2 = 0.96, (ln 2.5)^2/2 = 0.42
        ("token_k2", 0.5, [[0, 0, 1], [1, 1, 0]]),
        # seq_mean_k1: geometric mean of pi_rollout/pi_old per sequence: (1/3 * 4 * 1)^(1/3) = 1.10, (1/2.5)^(1/2) = 0.63
        ("seq_mean_k1", "0.8_2", [[1, 1, 1], [0, 0, 0]]),
        # seq_max_k2 <= 0.7: row 0's max is 0.96 -> dropped; row 1's is 0.42 -> kept
        ("seq_max_k2", 0.7, [[0, 0, 0], [1, 1, 0]]),
        # both criteria must pass
        ("token_k2,seq_max_k2", "0.5,0.7", [[0, 0, 0], [1, 1, 0]]),
    ],
)
def test_rejection_drops_tokens_or_whole_sequences(rs, threshold, keep):
    lr, mask = [[LN(3), LN(0.25), 0.0], [LN(2.5), 0.0, 9.0]], [[1, 1, 1], [1, 1, 0]]
    weights, out_mask, m = correct(lr, mask, rollout_rs=rs, rollout_rs_threshold=threshold)
    assert weights is None
    assert out_mask.tolist() == keep
    dropped = 5 - sum(map(sum, keep))
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(dropped / 5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(
        sum(any(k == 0 and v == 1 for k, v in zip(kr, mr)) for kr, mr in zip(keep, mask)) / 2
    )


def test_mismatch_metrics_are_always_reported():
    _, _, m = correct([[LN(2), LN(0.5)]], [[1, 1]])
    assert m["rollout_corr/kl"] == pytest.approx(0.0)  # mean(-log r) = -(ln 2 + ln 0.5) / 2
    assert m["rollout_corr/k3_kl"] == pytest.approx(((2 - 1 - LN(2)) + (0.5 - 1 - LN(0.5))) / 2)
    assert m["rollout_corr/chi2_token"] == pytest.approx((4 + 0.25) / 2 - 1)
    assert m["rollout_corr/chi2_seq"] == pytest.approx(0.0)  # product of ratios is 1
    assert m["rollout_corr/training_ppl"] == pytest.approx(math.exp(-(LN(2) + LN(0.5)) / 2))
    assert m["rollout_corr/rollout_ppl"] == pytest.approx(1.0)


def test_bad_specifications_say_what_to_write():
    with pytest.raises(ValueError, match="rollout_rs='token_k4'.*token_k1"):
        correct([[0.0]], [[1]], rollout_rs="token_k4", rollout_rs_threshold=2)
    with pytest.raises(ValueError, match="needs rollout_rs_threshold"):
        correct([[0.0]], [[1]], rollout_rs="token_k1")
    with pytest.raises(ValueError, match="for token_k2: use a positive number"):
        parse_rs_thresholds(["token_k2"], "0.5_2")
    with pytest.raises(ValueError, match="gives 2 values for 3"):
        parse_rs_thresholds(["token_k2", "token_k3", "seq_max_k2"], "1,2")
    with pytest.raises(ValueError, match="must be one of token, sequence"):
        correct([[0.0]], [[1]], rollout_is="geometric")
