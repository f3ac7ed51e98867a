"""DPO / IPO / hinge / cDPO, KTO and SFT losses against numbers worked out by hand."""

import math

import pytest
import torch

from hybridrl.algorithms import dpo_loss, kto_kl_estimate, kto_loss, sft_loss


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


# One pair: policy chosen -1, rejected -3; reference both -2.
# margin h = (-1 - -3) - (-2 - -2) = 2; beta = 0.5 -> beta h = 1.
PAIR = dict(policy_chosen_logps=t(-1.0), policy_rejected_logps=t(-3.0), ref_chosen_logps=t(-2.0), ref_rejected_logps=t(-2.0))


@pytest.mark.parametrize(
    "loss_type, ls, expected",
    [
        ("sigmoid", 0.0, math.log(1 + math.exp(-1))),  # -log sigmoid(1) = 0.313262
        ("sigmoid", 0.1, 0.9 * math.log(1 + math.exp(-1)) + 0.1 * math.log(1 + math.exp(1))),  # 0.413262
        ("ipo", 0.0, 1.0),  # (2 - 1 / (2 * 0.5))^2 = 1
        ("hinge", 0.0, 0.0),  # relu(1 - 1) = 0
    ],
)
def test_dpo_losses_hand_numbers(loss_type, ls, expected):
    out = dpo_loss(**PAIR, beta=0.5, loss_type=loss_type, label_smoothing=ls)
    assert out["losses"].item() == pytest.approx(expected, abs=1e-6)
    assert out["chosen_rewards"].item() == pytest.approx(0.5)  # 0.5 * (-1 - -2)
    assert out["rejected_rewards"].item() == pytest.approx(-0.5)  # 0.5 * (-3 - -2)


def test_dpo_at_the_reference_is_log2_and_hinge_below_margin():
    same = dpo_loss(t(-1.0, -4.0), t(-2.0, -5.0), t(-1.0, -4.0), t(-2.0, -5.0), beta=0.1)
    assert same["losses"].tolist() == pytest.approx([math.log(2)] * 2)  # h = 0: -log sigmoid(0)
    hinge = dpo_loss(t(-1.0), t(-2.0), t(-1.0), t(-1.0), beta=0.5, loss_type="hinge")  # h = 1
    assert hinge["losses"].item() == pytest.approx(0.5)  # relu(1 - 0.5)


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    pc, pr = t(-1.0).requires_grad_(), t(-3.0).requires_grad_()
    dpo_loss(pc, pr, t(-2.0), t(-2.0), beta=0.5)["losses"].sum().backward()
    s = 1 / (1 + math.exp(1))  # d/dh -log sigmoid(beta h) = -beta sigmoid(-beta h)
    assert pc.grad.item() == pytest.approx(-0.5 * s) and pr.grad.item() == pytest.approx(0.5 * s)


def test_dpo_rejects_unknown_loss_type():
    with pytest.raises(ValueError, match="unknown DPO loss_type 'robust'"):
        dpo_loss(**PAIR, beta=0.1, loss_type="robust")


def test_kto_losses_hand_numbers():
    # r = policy - ref: desirable 2, undesirable -1; z0 = 1; beta = 0.5
    out = kto_loss(
        t(-1.0, -4.0), t(-3.0, -3.0), torch.tensor([True, False]), 1.0, beta=0.5, desirable_weight=2.0, undesirable_weight=1.5
    )
    desirable = 2.0 * (1 - 1 / (1 + math.exp(-0.5)))  # 1 - sigmoid(0.5 * (2 - 1)) = 0.377541
    undesirable = 1.5 * (1 - 1 / (1 + math.exp(-1.0)))  # 1 - sigmoid(0.5 * (1 - -1)) = 0.268941
    assert out["losses"].tolist() == pytest.approx([desirable, undesirable], abs=1e-6)
    assert out["rewards"].tolist() == pytest.approx([1.0, -0.5])


def test_kto_reference_point_is_clamped_and_detached():
    policy = t(-2.0, -2.0).requires_grad_()
    z0 = kto_kl_estimate(policy, t(-1.0, -1.5))  # mean(-1, -0.5) = -0.75 -> clamped to 0
    assert z0.item() == 0.0 and not z0.requires_grad
    assert kto_kl_estimate(t(-1.0, -2.0), t(-2.0, -2.0)).item() == pytest.approx(0.5)  # mean(1, 0)
    # a negative z0 given directly is clamped too: r = 0, z0 -> 0 -> 1 - sigmoid(0) = 0.5
    assert kto_loss(t(-1.0), t(-1.0), torch.tensor([1]), -3.0, beta=0.1)["losses"].item() == pytest.approx(0.5)


def test_sft_loss_is_token_mean_over_response_tokens_and_accumulates():
    logp = t(-1.0, -2.0, -3.0).reshape(1, 3).repeat(2, 1)  # (2, 3)
    mask = t(1, 1, 0, 1, 0, 0).reshape(2, 3)
    assert sft_loss(logp, mask).item() == pytest.approx((1 + 2 + 1) / 3)
    # micro-batches normalized by the whole step's token count add up to the step's loss
    parts = [sft_loss(logp[i : i + 1], mask[i : i + 1], global_tokens=3.0) for i in range(2)]
    assert sum(p.item() for p in parts) == pytest.approx(4 / 3)
