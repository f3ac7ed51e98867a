"""Triton kernels for the decode step on CUDA: paged attention and fused sampling.

Both are tested against the torch implementations on CPU under TRITON_INTERPRET=1.
Importing this module needs triton; `available()` says whether the kernels can run here.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the engine then decodes with the torch reference
    triton = tl = None


def available(device: torch.device) -> bool:
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:

    @triton.jit
    def _paged_decode_kernel(
        Q, K, V, O, TABLES, LENS,
        stride_qb, stride_qh, stride_tb, stride_kblk, stride_ktok, stride_kh, stride_ob, stride_oh,
        scale,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        # One program = one sequence x one KV head, with the GROUP query heads that share it.
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D)
        g_ok = g < GROUP
        q = tl.load(Q + b * stride_qb + (kvh * GROUP + g)[:, None] * stride_qh + d[None, :], mask=g_ok[:, None], other=0.0)
        ctx = tl.load(LENS + b)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        for start in range(0, ctx, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)  # token positions of this tile
            ok = t < ctx
            blk = tl.load(TABLES + b * stride_tb + t // BLOCK_SIZE, mask=ok, other=0)
            off = blk.to(tl.int64) * stride_kblk + (t % BLOCK_SIZE) * stride_ktok + kvh * stride_kh
            k = tl.load(K + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)  # (BLOCK_N, D)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # (GROUP_PAD, BLOCK_N)
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m = m_new
        out = acc / l[:, None]
        tl.store(O + b * stride_ob + (kvh * GROUP + g)[:, None] * stride_oh + d[None, :], out.to(O.dtype.element_ty), mask=g_ok[:, None])

    @triton.jit
    def _mix32(x):
        x = ((x >> 16) ^ x) * 0x45D9F3B
        x = ((x >> 16) ^ x) * 0x45D9F3B
        return (x >> 16) ^ x

    @triton.jit
    def _sample_kernel(
        LOGITS, KEYS, INV_T, TOKENS, LOGPROBS, stride_l, V,
        GREEDY: tl.constexpr, BLOCK_V: tl.constexpr,
    ):  # fmt: skip
        # One program = one row: a single pass over the vocabulary keeps the running
        # log-sum-exp of x = logits / T and the running argmax of x + Gumbel noise.
        row = tl.program_id(0)
        inv_t = tl.load(INV_T)
        key = tl.load(KEYS + row).to(tl.uint32)
        m = float("-inf")
        s = 0.0
        best_z = float("-inf")
        best_x = 0.0
        best_i = 0
        for start in range(0, V, BLOCK_V):
            offs = start + tl.arange(0, BLOCK_V)
            ok = offs < V
            x = tl.load(LOGITS + row * stride_l + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
            if GREEDY:
                z = x
            else:
                h = _mix32(key ^ offs.to(tl.uint32))
                u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
                z = x - tl.log(-tl.log(u))
                z = tl.where(ok, z, float("-inf"))
            cz = tl.max(z, 0)
            ci = tl.argmax(z, 0)
            cx = tl.sum(tl.where(tl.arange(0, BLOCK_V) == ci, x, 0.0), 0)
            take = cz > best_z  # strict: the first maximum wins, as torch.argmax
            best_i = tl.where(take, start + ci, best_i)
            best_x = tl.where(take, cx, best_x)
            best_z = tl.where(take, cz, best_z)
            m_new = tl.maximum(m, tl.max(x, 0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
            m = m_new
        tl.store(TOKENS + row, best_i.to(tl.int64))
        tl.store(LOGPROBS + row, best_x - (m + tl.log(s)))


def paged_decode(q, cache_k, cache_v, block_tables, context_lens) -> torch.Tensor:
    """Same contract as attention.paged_decode_reference: q (B, H, D) -> (B, H, D)."""
    B, H, D = q.shape
    n_kv = cache_k.shape[2]
    group = H // n_kv
    out = torch.empty_like(q)
    _paged_decode_kernel[(B, n_kv)](
        q, cache_k, cache_v, out, block_tables, context_lens,
        q.stride(0), q.stride(1), block_tables.stride(0), cache_k.stride(0), cache_k.stride(1), cache_k.stride(2),
        out.stride(0), out.stride(1), D ** -0.5,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=D, BLOCK_SIZE=cache_k.shape[1], BLOCK_N=64,
    )  # fmt: skip
    return out


def fused_sample(logits, keys, inv_temperature, tokens_out, log_probs_out, greedy: bool) -> None:
    """logits (B, V) any float dtype; keys (B,) int64 from sampling.row_keys; inv_temperature a
    0-d float32 tensor (a device buffer, so a captured graph reads the current value)."""
    B, V = logits.shape
    _sample_kernel[(B,)](logits, keys, inv_temperature, tokens_out, log_probs_out, logits.stride(0), V,
                         GREEDY=greedy, BLOCK_V=1024)  # fmt: skip
