import math

import pytest
import torch

from hybridrl.algorithms import (
    KL_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # d = logp - ref = [0.5, -1.0]


@pytest.mark.parametrize(
    "kl_type, expected",
    [
        ("kl", [0.5, -1.0]),
        ("abs", [0.5, 1.0]),
        ("mse", [0.125, 0.5]),  # d^2 / 2
        ("low_var_kl", [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]),  # e^-d + d - 1
    ],
)
def test_kl_penalty_hand_numbers(kl_type, expected):
    torch.testing.assert_close(kl_penalty(LOGP, REF, kl_type), torch.tensor([expected]))


@pytest.mark.parametrize("name, alias", [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_kl_aliases(name, alias):
    torch.testing.assert_close(kl_penalty(LOGP, REF, name), kl_penalty(LOGP, REF, alias))


def test_k3_is_clamped_with_finite_gradient():
    # d = -30: e^30 overflows the [-10, 10] clamp; the gradient must still be finite (0).
    logp = torch.tensor([-31.0, -0.1], requires_grad=True)
    k3 = kl_penalty(logp, torch.tensor([-1.0, -0.1]), "k3")
    assert k3[0].item() == 10.0 and k3[1].item() == 0.0
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_unknown_kl_type_lists_names():
    assert "low_var_kl" in KL_TYPES
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "k4")


def test_adaptive_controller_numbers_and_state():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    ctl.update(current_kl=0.15, n_steps=10)  # e = clip(0.5) = 0.2 -> 0.1 * (1 + 0.2*10/100) = 0.102
    assert ctl.value == pytest.approx(0.102)
    ctl.update(current_kl=0.09, n_steps=10)  # e = -0.1 -> 0.102 * 0.99 = 0.10098
    assert ctl.value == pytest.approx(0.10098)
    ctl.update(current_kl=0.0, n_steps=10)  # e = clip(-1) = -0.2 -> 0.10098 * 0.98 = 0.0989604
    assert ctl.value == pytest.approx(0.0989604)

    restored = AdaptiveKLController(init_kl_coef=1.0, target_kl=0.1, horizon=100)
    restored.load_state_dict(ctl.state_dict())
    assert restored.value == ctl.value


def test_fixed_controller_and_factory():
    ctl = make_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(ctl, FixedKLController)
    ctl.update(current_kl=10.0, n_steps=100)
    assert ctl.value == 0.05
    adaptive = make_kl_controller("adaptive", 0.05, target_kl=0.1, horizon=10)
    assert isinstance(adaptive, AdaptiveKLController)
    with pytest.raises(ValueError, match="adaptive"):
        make_kl_controller("pid", 0.05)


def test_apply_kl_penalty_hand_numbers():
    # k1 per token: row 0 [0.5, 0, 0]; row 1 [1, 0, (8 on padding -> ignored)].
    # rewards = scores - 0.1 * kl; current_kl = mean(0.5/3, 1/2) = 1/3.
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp = torch.full((2, 3), -1.0)
    ref = torch.tensor([[-1.5, -1.0, -1.0], [-2.0, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rewards, current_kl = apply_kl_penalty(scores, logp, ref, mask, kl_coef=0.1, kl_type="kl")
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 0.0, 1.0], [-0.1, 2.0, 0.0]]))
    assert isinstance(current_kl, float)
    assert current_kl == pytest.approx(1 / 3)
