"""The LM head's Triton kernels (hybridrl.models.logprob_kernels) against the torch functions they
replace on CUDA: run by the Triton interpreter on CPU (float32), directly on a GPU (also bf16)."""

import pytest
import torch
from triton_helpers import INTERPRETED, KDEV, RUN_INTERPRETED, require_kernels, run_interpreted

from hybridrl.models import logprobs
from hybridrl.models.logprobs import _chunk_grad, _chunk_stats, fused_log_probs

CUDA = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")


@pytest.fixture
def k():
    require_kernels()
    from hybridrl.models import logprob_kernels

    return logprob_kernels


@pytest.mark.slow  # a child pytest
@RUN_INTERPRETED
def test_kernels_under_the_triton_interpreter():
    run_interpreted(__file__, passed=13)


def _logits(seed: int, n: int, V: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, V, generator=g) * 3
    z[1, 7] = z[1, V - 5] = z[1].max() + 1  # a tie for the argmax, in different blocks: the first wins
    z[2, 100] = z[2, 101] = z[2].max() + 1  # and inside one block
    labels = torch.randint(0, V, (n,), generator=g)
    labels[1], labels[2] = 7, 101  # a hit, and a miss on the tie's second index
    labels[3] = z[3].argmax()
    return z.to(KDEV, dtype), labels.to(KDEV)


@pytest.mark.parametrize("want_entropy", [True, False])
@pytest.mark.parametrize(
    "temperature,V,block,parts", [(1.0, 1000, 256, 0), (0.7, 1000, 128, 3), (1.3, 300, 1024, 0), (1.0, 1000, 64, 2)]
)
def test_triton_stats_match_torch(k, want_entropy, temperature, V, block, parts):
    """parts=0: a program per block; else each program walks several blocks (the last part's last
    block partly or wholly past the vocabulary)."""
    z, labels = _logits(0, 9, V)
    got = k.logit_stats(z, labels, 1 / temperature, want_entropy, block=block, parts=parts)
    want = _chunk_stats(z, labels, 1 / temperature, want_entropy)
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)
    assert torch.equal(got[3], want[3])
    assert got[3][:4].tolist() == [labels[0].item() == z[0].argmax().item(), True, False, True]
    z64 = z.double() / temperature  # and the float64 definition
    lse = torch.logsumexp(z64, -1)
    torch.testing.assert_close(got[0].double(), z64.gather(1, labels[:, None])[:, 0] - lse, atol=1e-5, rtol=0)
    if want_entropy:
        p = torch.softmax(z64, -1)
        torch.testing.assert_close(got[2].double(), -(p * torch.log_softmax(z64, -1)).sum(-1), atol=1e-4, rtol=0)


def test_triton_stats_never_read_outside_the_row_for_a_label_out_of_range(k):
    """torch's gather raises on such a label; the kernel must not read another row's logits (or
    past the tensor): the row's log-prob is NaN, which the trainer's non-finite check reports."""
    z, labels = _logits(4, 5, 300)
    labels[0], labels[4] = 300, -1
    logp, lse, _, hit = k.logit_stats(z, labels, 1.0, False, block=64, parts=2)
    assert torch.isnan(logp[[0, 4]]).all() and torch.isfinite(logp[1:4]).all()
    torch.testing.assert_close(lse, torch.logsumexp(z, -1))
    assert not hit[[0, 4]].any()


@pytest.mark.parametrize("with_entropy", [True, False])
@pytest.mark.parametrize("v0,block_r,block_c", [(0, 4, 128), (300, 16, 64)])
def test_triton_grad_matches_torch(k, with_entropy, v0, block_r, block_c):
    z, labels = _logits(1, 11, 1000)
    lse, _, ent, _ = _chunk_stats(z, labels, 1.0, True)
    g = torch.Generator().manual_seed(2)
    g_logp, g_ent = (torch.randn(11, generator=g).to(KDEV) for _ in range(2))
    g_ent = g_ent if with_entropy else None
    block = z[:, v0 : v0 + 450]  # a vocabulary slice: a strided view, labels counted from its start
    got = k.logit_grad(block, labels - v0, lse, ent, g_logp, g_ent, 1.0, block_r=block_r, block_c=block_c)
    want = _chunk_grad(block, labels - v0, lse, ent, g_logp, g_ent, 1.0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # in place, over the logits themselves (the backward of kept logits): the same values
    inplace = block.clone()
    got = k.logit_grad(inplace, labels - v0, lse, ent, g_logp, g_ent, 1.0, out=inplace, block_r=block_r, block_c=block_c)
    assert got is inplace
    torch.testing.assert_close(inplace, want, atol=1e-6, rtol=1e-5)


@CUDA
@pytest.mark.parametrize("with_entropy", [True, False])
def test_fused_log_probs_with_the_kernels_matches_the_compiled_torch_path_in_bf16(with_entropy):
    """The whole function under bf16 autocast, kernels on and off: the same log-probs up to the
    float32 summation order, and gradients that agree far inside bf16's rounding."""
    g = torch.Generator(device="cuda").manual_seed(3)
    N, H, V = 700, 64, 5000
    hidden = (torch.randn(N, H, device="cuda", generator=g) * 2).requires_grad_()
    weight = (torch.randn(V, H, device="cuda", generator=g) / H**0.5).requires_grad_()
    labels = torch.randint(0, V, (N,), device="cuda", generator=g)
    coef = torch.randn(N, device="cuda", generator=g)
    out = {}
    try:
        for use in (True, False):
            logprobs.USE_TRITON = use
            with torch.autocast("cuda", dtype=torch.bfloat16):
                lp, ent, hit = fused_log_probs(hidden, weight, labels, with_entropy=with_entropy, chunk=64)
            loss = (coef * lp).sum() + ((0.1 * coef * ent).sum() if with_entropy else 0)
            out[use] = (lp, ent, hit, *torch.autograd.grad(loss, [hidden, weight]))
    finally:
        logprobs.USE_TRITON = True
    (lp1, ent1, hit1, gh1, gw1), (lp0, ent0, hit0, gh0, gw0) = out[True], out[False]
    torch.testing.assert_close(lp1, lp0, atol=1e-4, rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent1, ent0, atol=1e-4, rtol=1e-5)
    assert torch.equal(hit1, hit0)
    for a, b in ((gh1, gh0), (gw1, gw0)):
        assert ((a - b).norm() / b.norm()).item() < 1e-3
