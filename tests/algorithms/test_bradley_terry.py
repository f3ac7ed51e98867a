"""The Bradley-Terry reward-model loss against numbers worked out by hand, in float64."""

import math

import torch

from hybridrl.algorithms import bradley_terry_loss


def test_bradley_terry_loss_by_hand():
    chosen = torch.tensor([2.0, 0.5, -1.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([1.0, 0.5, 1.0], dtype=torch.float64)
    margin = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    out = bradley_terry_loss(chosen, rejected, margin)
    # d = r_c - r_r - m = [1, 0, -3]; loss = log(1 + exp(-d))
    want = [math.log(1 + math.exp(-1.0)), math.log(2.0), math.log(1 + math.exp(3.0))]
    torch.testing.assert_close(out["losses"], torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # d loss / d r_c = -sigmoid(-d) = -1 / (1 + exp(d))
    out["losses"].sum().backward()
    grad = [-1 / (1 + math.exp(1.0)), -0.5, -1 / (1 + math.exp(-3.0))]
    torch.testing.assert_close(chosen.grad, torch.tensor(grad, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # no margin = margin 0; the scores come back detached
    no_margin = bradley_terry_loss(chosen.detach(), rejected)["losses"]
    torch.testing.assert_close(no_margin[:2], out["losses"][:2])
    assert math.isclose(float(no_margin[2]), math.log(1 + math.exp(2.0)), rel_tol=1e-12)
    assert not out["chosen"].requires_grad and torch.equal(out["rejected"], rejected)


def test_doctest():
    import doctest

    from hybridrl.algorithms import preference

    assert doctest.testmod(preference).failed == 0
