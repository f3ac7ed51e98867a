"""Two fused Triton kernels for the decoder on CUDA, where a decode step is bound by kernel
launches rather than bytes: residual add + RMSNorm, and SiLU(gate) * up.

HF adds the residual in the model dtype, normalizes in float32, casts back, then multiplies by
the weight; the norm kernel keeps those roundings so a bf16 model computes the same numbers, and
replaces the ~9 small kernels of the torch version. Importing this module needs triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(RES, DELTA, W, RES_OUT, OUT, N, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    x = tl.load(DELTA + row * N + offs, mask=ok, other=0.0)
    if HAS_RES:
        x = x + tl.load(RES + row * N + offs, mask=ok, other=0.0)  # in the model dtype, as HF
    tl.store(RES_OUT + row * N + offs, x, mask=ok)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    normed = (xf * inv).to(x.dtype)
    w = tl.load(W + offs, mask=ok, other=0.0)
    tl.store(OUT + row * N + offs, (w * normed).to(OUT.dtype.element_ty), mask=ok)


def fused_add_rms_norm(residual: torch.Tensor | None, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(residual + delta, RMSNorm(residual + delta) * weight) for (..., N) tensors."""
    N = delta.shape[-1]
    delta = delta.contiguous()
    res_out = torch.empty_like(delta)
    out = torch.empty_like(delta)
    rows = delta.numel() // N
    res = residual.contiguous() if residual is not None else delta
    _add_rms_norm_kernel[(rows,)](
        res, delta, weight, res_out, out, N, eps, HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(N)
    )
    return res_out, out


@triton.jit
def _silu_mul_kernel(GU, OUT, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < I
    g = tl.load(GU + row * 2 * I + offs, mask=ok, other=0.0)
    u = tl.load(GU + row * 2 * I + I + offs, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # silu in float32, rounded as torch does
    tl.store(OUT + row * I + offs, act * u, mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(..., 2I) = [gate | up] -> SiLU(gate) * up (..., I)."""
    I = gate_up.shape[-1] // 2
    gate_up = gate_up.contiguous()
    out = torch.empty(*gate_up.shape[:-1], I, dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.numel() // (2 * I)
    _silu_mul_kernel[(rows, triton.cdiv(I, 1024))](gate_up, out, I, BLOCK=1024)
    return out
