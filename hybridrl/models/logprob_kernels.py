"""Triton kernels for the LM head's softmax algebra on CUDA (`hybridrl.models.logprobs`).

A chunk of logits is `[rows, vocab]` in bf16: for Qwen2.5's 152k vocabulary, 300 kB a row. The
work per entry is a few flops, so reading the chunk once is the cost. Inductor's code for the
forward statistics (logsumexp, the label's log-prob, entropy, argmax) walked each row in several
loops, one per dependent reduction, and ran at ~3.6x the read floor; the backward's pointwise
kernel at ~2.7x. Here:

- `logit_stats`: one pass. Programs over (row, part of the vocabulary) keep an online max, sum
  of exp, sum of exp * z and argmax; a second kernel merges a row's parts.
- `logit_grad`: d loss / d logits of one (rows, columns) block of the logits, tiled in 2-D.

Both compute in float32 from the logits' dtype, as the torch functions they replace.
Importing this module needs triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _stats_partial_kernel(Z, PM, PS, PT, PI, stride_z, V, n_parts, per_part, inv_t, WANT_ENT: tl.constexpr, BLOCK: tl.constexpr):
    # Program (row, part): walks `per_part` blocks of BLOCK entries of the row with an online max,
    # sum of exp(z - max), sum of exp(z - max) * z and argmax, and writes them for the merge.
    row = tl.program_id(0)
    part = tl.program_id(1)
    zrow = Z + row.to(tl.int64) * stride_z
    m = float("-inf")
    s = 0.0
    t = 0.0
    idx = 0
    for j in range(0, per_part):
        start = (part * per_part + j) * BLOCK
        offs = start + tl.arange(0, BLOCK)
        ok = offs < V
        z = tl.load(zrow + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        mb, ib = tl.max(z, 0, return_indices=True)
        m_new = tl.maximum(m, mb)
        alpha = tl.exp(m - m_new)  # m = -inf at the start: 0
        e = tl.exp(z - m_new)
        s = s * alpha + tl.sum(e, 0)
        if WANT_ENT:
            t = t * alpha + tl.sum(tl.where(ok, e * z, 0.0), 0)
        idx = tl.where(mb > m, start + ib, idx)  # strictly greater: the first index of a tie stays
        m = m_new
    out = row * n_parts + part
    tl.store(PM + out, m)
    tl.store(PS + out, s)
    if WANT_ENT:
        tl.store(PT + out, t)
    tl.store(PI + out, idx)


@triton.jit
def _stats_combine_kernel(
    Z, LABELS, PM, PS, PT, PI, LOGP, LSE, ENT, HIT, stride_z, V, n_parts, inv_t, WANT_ENT: tl.constexpr, P_PAD: tl.constexpr
):
    row = tl.program_id(0)
    b = tl.arange(0, P_PAD)  # the row's parts
    ok = b < n_parts
    base = row * n_parts
    m = tl.load(PM + base + b, mask=ok, other=float("-inf"))
    s = tl.load(PS + base + b, mask=ok, other=0.0)
    top = tl.max(m, 0)
    r = tl.exp(m - top)
    total = tl.sum(s * r, 0)
    lse = top + tl.log(total)
    best = tl.argmax(m, 0)  # the first part holding the max: torch's argmax takes the first index
    idx = tl.sum(tl.where(b == best, tl.load(PI + base + b, mask=ok, other=0), 0), 0)
    label = tl.load(LABELS + row)
    valid = (label >= 0) & (label < V)  # never read outside the row: a label out of range gives NaN
    zl = tl.load(Z + row.to(tl.int64) * stride_z + label, mask=valid, other=float("nan")).to(tl.float32) * inv_t
    tl.store(LOGP + row, zl - lse)
    tl.store(LSE + row, lse)
    if WANT_ENT:
        t = tl.load(PT + base + b, mask=ok, other=0.0)
        tl.store(ENT + row, lse - tl.sum(t * r, 0) / total)  # H = lse - E_p[z]
    else:
        tl.store(ENT + row, 0.0)
    tl.store(HIT + row, (idx == label).to(tl.int8))


def logit_stats(
    z: torch.Tensor,
    labels: torch.Tensor,
    inv_temp: float,
    want_entropy: bool,
    block: int = 2048,
    parts: int = 4,
    num_warps: int = 4,
):
    """Same contract as logprobs._chunk_stats: z (rows, V) logits, labels (rows,) ->
    (log p(label), logsumexp, entropy or zeros, argmax == label), float32 (bool for the last).
    Each row is split into `parts` programs (0: one per block of `block` entries). The defaults
    were the fastest of a sweep on an H100 (benchmarks/lab/lm_head_kernels.py, 883 x 152k bf16
    logits: 0.18 ms without entropy, 0.21 ms with, against 0.34 / 0.45 ms for the compiled torch
    and a 0.10 ms read floor)."""
    rows, V = z.shape
    if z.stride(1) != 1:
        z = z.contiguous()
    labels = labels.contiguous()
    n_blocks = triton.cdiv(V, block)
    parts = min(parts or n_blocks, n_blocks)
    per_part = triton.cdiv(n_blocks, parts)
    parts = triton.cdiv(n_blocks, per_part)
    pm, ps, pt = (torch.empty(rows, parts, dtype=torch.float32, device=z.device) for _ in range(3))
    pidx = torch.empty(rows, parts, dtype=torch.int32, device=z.device)
    logp, lse, ent = (torch.empty(rows, dtype=torch.float32, device=z.device) for _ in range(3))
    hit = torch.empty(rows, dtype=torch.int8, device=z.device)
    if rows:
        _stats_partial_kernel[(rows, parts)](
            z, pm, ps, pt, pidx, z.stride(0), V, parts, per_part, inv_temp, WANT_ENT=want_entropy, BLOCK=block,
            num_warps=num_warps,
        )  # fmt: skip
        _stats_combine_kernel[(rows,)](
            z,
            labels,
            pm,
            ps,
            pt,
            pidx,
            logp,
            lse,
            ent,
            hit,
            z.stride(0),
            V,
            parts,
            inv_temp,
            WANT_ENT=want_entropy,
            P_PAD=max(2, triton.next_power_of_2(parts)),
        )
    return logp, lse, ent, hit.bool()


@triton.jit
def _grad_kernel(
    Z,
    DZ,
    LABELS,
    LSE,
    ENT,
    GLP,
    GENT,
    n,
    c,
    stride_z,
    stride_dz,
    inv_t,
    HAS_ENT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    col = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    r_ok, c_ok = r < n, col < c
    ok = r_ok[:, None] & c_ok[None, :]
    z = tl.load(Z + r[:, None].to(tl.int64) * stride_z + col[None, :], mask=ok, other=0.0).to(tl.float32) * inv_t
    lse = tl.load(LSE + r, mask=r_ok, other=0.0)
    g = tl.load(GLP + r, mask=r_ok, other=0.0)
    label = tl.load(LABELS + r, mask=r_ok, other=-1)  # counted from this block's first column
    p = tl.exp(z - lse[:, None])
    dz = (tl.where(col[None, :] == label[:, None], 1.0, 0.0) - p) * g[:, None]
    if HAS_ENT:
        ent = tl.load(ENT + r, mask=r_ok, other=0.0)
        ge = tl.load(GENT + r, mask=r_ok, other=0.0)
        dz += p * ((lse - ent)[:, None] - z) * ge[:, None]
    tl.store(DZ + r[:, None].to(tl.int64) * stride_dz + col[None, :], (dz * inv_t).to(DZ.dtype.element_ty), mask=ok)


def logit_grad(z, labels, lse, ent, g_logp, g_ent, inv_temp: float, out=None, block_r: int = 16, block_c: int = 512):
    """Same contract as logprobs._chunk_grad: z (rows, c) a block of the logits, labels counted from
    its first column -> d loss / d z in z's dtype, written to `out` when given (`z` itself is fine:
    each entry is read and written by the same program)."""
    n, c = z.shape
    dz = torch.empty((n, c), dtype=z.dtype, device=z.device) if out is None else out
    assert dz.shape == (n, c) and dz.stride(1) == 1 and z.stride(1) == 1
    if n and c:
        _grad_kernel[(triton.cdiv(n, block_r), triton.cdiv(c, block_c))](
            z,
            dz,
            labels.contiguous(),
            lse,
            ent,
            g_logp,
            g_ent if g_ent is not None else g_logp,
            n,
            c,
            z.stride(0),
            dz.stride(0),
            inv_temp,
            HAS_ENT=g_ent is not None,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
        )
    return dz
