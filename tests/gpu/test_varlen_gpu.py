"""The `varlen` packed attention (`hybridrl.models.packing._FlashVarlen`: aten's FlashAttention-2
varlen kernels, grouped KV heads as they are) against torch's `varlen_attn` on repeated KV heads
and against a float64 reference, forward and gradients, eager and compiled. Skipped without CUDA."""

import pytest
import torch

from hybridrl.models import packing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _row(hq: int, hkv: int, d: int, lens: list[int], seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = sum(lens)
    q, k, v = (torch.randn(n, h, d, device="cuda", generator=g) for h in (hq, hkv, hkv))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, cu, max(lens), torch.randn(n, hq, d, device="cuda", generator=g)


def _grads(fn, q, k, v, cu, max_len, grad, dtype):
    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, cu, max_len, q.shape[-1] ** -0.5)
    (out.to(grad.dtype) * grad).sum().backward()
    return [out.detach().double(), *(x.grad.double() for x in leaves)]


def _torch_varlen_repeated(q, k, v, cu, max_len, scale):
    from torch.nn.attention.varlen import varlen_attn

    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    try:
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, is_causal=True)
    except TypeError:  # later torch: a causal window instead of is_causal
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=(-1, 0))


@pytest.mark.parametrize("heads", [(14, 2, 64), (12, 12, 128), (8, 1, 64)])
def test_varlen_matches_torch_varlen_and_float64(heads):
    hq, hkv, d = heads
    lens = [37, 1, 200, 64, 129, 5]
    q, k, v, cu, max_len, grad = _row(hq, hkv, d, lens, seed=hq + d)
    ours = _grads(packing._varlen, q, k, v, cu, max_len, grad, torch.bfloat16)
    theirs = _grads(_torch_varlen_repeated, q, k, v, cu, max_len, grad, torch.bfloat16)
    exact = _grads(packing._sdpa_padded, q, k, v, cu, max_len, grad, torch.float64)
    for name, a, b, ref in zip(("out", "dq", "dk", "dv"), ours, theirs, exact):
        err_ours, err_theirs = float((a - ref).norm()), float((b - ref).norm())
        # bf16 kernels: the same error as torch's path, and small against the tensor itself
        assert err_ours <= 1.05 * err_theirs + 1e-6 * float(ref.norm()), (name, err_ours, err_theirs)
        assert err_ours <= 0.02 * float(ref.norm()), (name, err_ours)
    assert torch.equal(ours[0], theirs[0])  # the forward is the same kernel on the same numbers


def test_varlen_compiled_equals_eager():
    q, k, v, cu, max_len, grad = _row(14, 2, 64, [90, 3, 250, 17], seed=1)
    eager = _grads(packing._varlen, q, k, v, cu, max_len, grad, torch.bfloat16)
    compiled = _grads(torch.compile(packing._varlen, dynamic=True), q, k, v, cu, max_len, grad, torch.bfloat16)
    assert torch.equal(eager[0], compiled[0])
    for a, b in zip(eager[1:], compiled[1:]):  # the backward accumulates dq with atomics: rounding order varies
        assert float((a - b).norm()) <= 1e-2 * float(b.norm())
