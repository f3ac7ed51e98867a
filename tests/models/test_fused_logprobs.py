"""The chunked LM-head log-prob/entropy function equals the naive one in value and gradient."""

import pytest
import torch

from hybridrl.models.logprobs import fused_log_probs

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["keep", "recompute"])
def backward_path(request, monkeypatch):
    """The backward over logits kept by the forward (in-place gradient, one GEMM each) and over
    logits recomputed slice by slice (KEEP_LOGITS_BYTES=0, as for batches too large to keep)."""
    from hybridrl.models import logprobs

    if request.param == "recompute":
        monkeypatch.setattr(logprobs, "KEEP_LOGITS_BYTES", 0)
    return request.param


def naive(hidden, weight, labels, temperature):
    logits = hidden @ weight.T / temperature  # (N, V)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy, logits.argmax(-1) == labels


@pytest.mark.parametrize("temperature,chunk", [(1.0, 3), (0.7, 4), (1.3, 64)])
def test_fused_matches_naive_value_and_gradient_float64(temperature, chunk, backward_path):
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


def test_fused_log_prob_only_gradient_and_no_entropy(backward_path):
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
def test_bf16_gradients_stay_close_to_float64(chunk, device, addmm, monkeypatch, backward_path):
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


def test_logits_are_kept_only_for_a_backward_and_within_the_byte_limit(monkeypatch):
    """No-grad passes (log-probs, reference) keep nothing; a pass with gradients keeps N x V
    logits only up to KEEP_LOGITS_BYTES; the backward releases them; the results never depend on
    which path ran."""
    from hybridrl.models import logprobs

    kept, contexts = [], []
    forward = logprobs._FusedLogProbs.forward

    def spy(ctx, *args):
        out = forward(ctx, *args)
        kept.append(ctx.logits is not None)
        contexts.append(ctx)
        return out

    monkeypatch.setattr(logprobs._FusedLogProbs, "forward", staticmethod(spy))
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(10, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 10, (6,), generator=g)
    with torch.no_grad():
        lp_nograd = fused_log_probs(hidden, weight, labels)[0]
    grads = {}
    for limit in (6 * 10 * 8, 6 * 10 * 8 - 1):  # exactly the logits' bytes: kept; one byte less: recomputed
        monkeypatch.setattr(logprobs, "KEEP_LOGITS_BYTES", limit)
        lp = fused_log_probs(hidden, weight, labels)[0]
        torch.testing.assert_close(lp, lp_nograd, rtol=0, atol=0)
        grads[limit] = torch.autograd.grad(lp.sum(), [hidden, weight])
    assert kept == [False, True, False]
    assert all(ctx.logits is None for ctx in contexts)  # the backward let go of the kept ones
    for a, b in zip(*grads.values()):
        torch.testing.assert_close(a, b)


@CUDA
def test_on_cuda_logits_are_kept_only_where_they_fit(monkeypatch):
    """The kept logits must fit, with margin, in the free device memory plus the allocator's unused
    cache, and are never kept inside a CUDA-graph capture (its pool would hold them for good)."""
    from hybridrl.models import logprobs

    hidden = torch.randn(64, 16, device="cuda", requires_grad=True)
    weight = torch.randn(1000, 16, device="cuda", requires_grad=True)
    need = 64 * 1000 * 2  # bf16 logits
    assert logprobs._keep_logits(hidden, weight, torch.bfloat16)
    unused = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    for free, keep in ((need * 5 // 4 + (1 << 30) - unused, True), (need * 5 // 4 + (1 << 30) - unused - 1, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, f=free: (f, 80 << 30))
        assert logprobs._keep_logits(hidden, weight, torch.bfloat16) is keep
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not logprobs._keep_logits(hidden, weight, torch.bfloat16)
    monkeypatch.undo()
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)  # trainer.deterministic
    assert not logprobs._keep_logits(hidden, weight, torch.bfloat16)


def test_an_allocation_that_fails_falls_back_to_recomputing(monkeypatch):
    """Logits that passed the memory check but cannot be allocated after all: no buffer, and the
    backward recomputes them, with the same values, instead of the run failing."""
    from hybridrl.models import logprobs

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with monkeypatch.context() as m:
        m.setattr(torch, "empty", no_memory)
        assert logprobs._logits_buffer(3, 5, torch.float32, torch.device("cpu")) is None
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 4, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (7,), generator=g)
    want = torch.autograd.grad(fused_log_probs(hidden, weight, labels)[0].sum(), [hidden, weight])
    calls = []
    monkeypatch.setattr(logprobs, "_logits_buffer", lambda *args: calls.append(args))  # returns None
    got = torch.autograd.grad(fused_log_probs(hidden, weight, labels)[0].sum(), [hidden, weight])
    assert calls == [(7, 11, torch.float64, torch.device("cpu"))]  # the keep path was chosen
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
