"""The chunked LM-head log-prob/entropy function equals the naive one in value and gradient."""

import pytest
import torch

from hybridrl.models.logprobs import fused_log_probs

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def naive(hidden, weight, labels, temperature):
    logits = hidden @ weight.T / temperature  # (N, V)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, logits.argmax(-1) == labels


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 4), (1.3, 64)])
def test_fused_matches_naive_value_and_gradient_float64(temperature, chunk):
    g = torch.Generator().manual_seed(0)
    N, H, V = 11, 8, 37
    hidden = (torch.randn(N, H, generator=g, dtype=torch.float64) * 2).requires_grad_()
    weight = torch.randn(V, H, generator=g, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g)
    a, b = torch.randn(N, generator=g, dtype=torch.float64), torch.randn(N, generator=g, dtype=torch.float64)

    lp, ent, hit = fused_log_probs(hidden, weight, labels, temperature=temperature, with_entropy=True, chunk=chunk)
    gh, gw = torch.autograd.grad((a * lp).sum() + (b * ent).sum(), [hidden, weight])
    lp0, ent0, hit0 = naive(hidden, weight, labels, temperature)
    gh0, gw0 = torch.autograd.grad((a * lp0).sum() + (b * ent0).sum(), [hidden, weight])

    torch.testing.assert_close(lp, lp0)
    torch.testing.assert_close(ent, ent0)
    assert torch.equal(hit, hit0)
    torch.testing.assert_close(gh, gh0)
    torch.testing.assert_close(gw, gw0)


def test_fused_log_prob_only_gradient_and_no_entropy():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(9, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 9, (5,), generator=g)
    lp, ent, _ = fused_log_probs(hidden, weight, labels, chunk=2)
    assert ent is None
    gh, gw = torch.autograd.grad(lp.sum(), [hidden, weight])
    lp0 = naive(hidden, weight, labels, 1.0)[0]
    gh0, gw0 = torch.autograd.grad(lp0.sum(), [hidden, weight])
    torch.testing.assert_close(gh, gh0)
    torch.testing.assert_close(gw, gw0)


@pytest.mark.parametrize(
    "device,addmm", [("cpu", False), pytest.param("cuda", False, marks=CUDA), pytest.param("cuda", True, marks=CUDA)]
)
@pytest.mark.parametrize("chunk", [8, 1000])
def test_bf16_gradients_stay_close_to_float64(chunk, device, addmm, monkeypatch):
    """Under bf16 autocast (float32 weights, as the trainer holds them) the gradients, computed over
    vocabulary slices (chunk=8: 10 slices of 100 entries) or in one piece, stay within bf16's
    rounding of the float64 reference (measured ~3e-3 on CPU). `addmm`: the row gradient
    accumulated in float32 inside the GEMM (GRAD_H_ADDMM, CUDA only)."""
    from hybridrl.models import logprobs

    monkeypatch.setattr(logprobs, "GRAD_H_ADDMM", addmm)
    g = torch.Generator().manual_seed(2)
    N, H, V = 80, 32, 1000
    hidden = (torch.randn(N, H, generator=g) * 2).to(device).requires_grad_()
    weight = (torch.randn(V, H, generator=g) / H**0.5).to(device).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=g).to(device)
    a = torch.randn(N, generator=g).to(device)
    with torch.autocast(device, dtype=torch.bfloat16):
        lp, _, _ = fused_log_probs(hidden, weight, labels, chunk=chunk)
    gh, gw = torch.autograd.grad((a * lp).sum(), [hidden, weight])
    assert gh.dtype == hidden.dtype and gw.dtype == weight.dtype
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    lp0 = naive(h64, w64, labels, 1.0)[0]
    gh0, gw0 = torch.autograd.grad((a.double() * lp0).sum(), [h64, w64])
    for got, want in ((gh, gh0), (gw, gw0)):
        rel = (got.double() - want).norm() / want.norm()
        assert rel < 1e-2, rel
