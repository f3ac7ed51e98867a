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
        Q,
        K,
        V,
        O,
        TABLES,
        LENS,
        stride_qb,
        stride_qh,
        stride_tb,
        stride_kblk,
        stride_ktok,
        stride_kh,
        stride_ob,
        stride_oh,
        scale,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        D: tl.constexpr,
        D_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        # One program = one sequence x one KV head, with the GROUP query heads that share it.
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, D_PAD)  # head_dim padded to a power of two >= 16 (tl.dot's minimum)
        g_ok = g < GROUP
        d_ok = d < D
        q = tl.load(
            Q + b * stride_qb + (kvh * GROUP + g)[:, None] * stride_qh + d[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0
        )
        ctx = tl.load(LENS + b)
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
        for start in range(0, ctx, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)  # token positions of this tile
            ok = t < ctx
            blk = tl.load(TABLES + b * stride_tb + t // BLOCK_SIZE, mask=ok, other=0)
            off = blk.to(tl.int64) * stride_kblk + (t % BLOCK_SIZE) * stride_ktok + kvh * stride_kh
            k = tl.load(K + off[:, None] + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_N, D_PAD)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale  # (GROUP_PAD, BLOCK_N)
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + off[:, None] + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
            m = m_new
        out = acc / l[:, None]
        tl.store(
            O + b * stride_ob + (kvh * GROUP + g)[:, None] * stride_oh + d[None, :],
            out.to(O.dtype.element_ty),
            mask=g_ok[:, None] & d_ok[None, :],
        )

    if os.environ.get("TRITON_INTERPRET") != "1":  # the interpreter cannot time configs
        # Tile length and warps picked by timing on the first decode step (before graph capture).
        _paged_decode_kernel = triton.autotune(
            configs=[triton.Config({"BLOCK_N": n}, num_warps=w) for n, w in ((32, 4), (64, 4), (128, 4), (64, 8), (128, 8))],
            key=["D_PAD", "GROUP_PAD", "BLOCK_SIZE"],
        )(_paged_decode_kernel)
        PAGED_DEFAULTS = {}
    else:
        PAGED_DEFAULTS = {"BLOCK_N": 64}

    @triton.jit
    def _rope_paged_decode_kernel(
        Q,
        KN,
        VN,
        COS,
        SIN,
        POS,
        SLOTS,
        K,
        V,
        O,
        TABLES,
        LENS,
        stride_qb,
        stride_qh,
        stride_knb,
        stride_knh,
        stride_vnb,
        stride_vnh,
        stride_tb,
        stride_kblk,
        stride_ktok,
        stride_kh,
        stride_ob,
        stride_oh,
        scale,
        rows_bucket,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        D: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        # The decode step's attention in one kernel: rotate this token's q heads and its k head,
        # store its k and v in the cache slot, attend over the cached context (ctx - 1 tokens) and
        # add the new token's own term from registers, so nothing waits for the store to land.
        # One program = one sequence x one KV head, with the GROUP query heads that share it.
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        d = tl.arange(0, D)
        half: tl.constexpr = D // 2
        partner = (d + half) % D
        sign = tl.where(d < half, -1.0, 1.0)
        pos = tl.load(POS + b)
        cos = tl.load(COS + pos * D + d)
        sin = tl.load(SIN + pos * D + d)
        g = tl.arange(0, GROUP_PAD)
        g_ok = g < GROUP
        qrow = Q + b * stride_qb + (kvh * GROUP + g)[:, None] * stride_qh
        q = tl.load(qrow + d[None, :], mask=g_ok[:, None], other=0.0)
        qp = tl.load(qrow + partner[None, :], mask=g_ok[:, None], other=0.0)
        # rounded to q's dtype, as the unfused path stores the rotated q before attending
        q = (q.to(tl.float32) * cos[None, :] + sign[None, :] * qp.to(tl.float32) * sin[None, :]).to(Q.dtype.element_ty)
        krow = KN + b * stride_knb + kvh * stride_knh
        k_new = tl.load(krow + d).to(tl.float32) * cos + sign * tl.load(krow + partner).to(tl.float32) * sin
        k_new = k_new.to(K.dtype.element_ty)
        v_new = tl.load(VN + b * stride_vnb + kvh * stride_vnh + d)
        slot = tl.load(SLOTS + b).to(tl.int64)  # the cache is contiguous over (block, offset): slot * stride_ktok
        tl.store(K + slot * stride_ktok + kvh * stride_kh + d, k_new)
        tl.store(V + slot * stride_ktok + kvh * stride_kh + d, v_new.to(V.dtype.element_ty))
        cached = tl.load(LENS + b) - 1
        m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, D], tl.float32)
        for start in range(0, cached, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)
            ok = t < cached
            blk = tl.load(TABLES + b * stride_tb + t // BLOCK_SIZE, mask=ok, other=0)
            off = blk.to(tl.int64) * stride_kblk + (t % BLOCK_SIZE) * stride_ktok + kvh * stride_kh
            k = tl.load(K + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + off[:, None] + d[None, :], mask=ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
            m = m_new
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale  # (GROUP_PAD,)
        m_new = tl.maximum(m, s_new)
        alpha = tl.exp(m - m_new)
        p_new = tl.exp(s_new - m_new)
        l = l * alpha + p_new
        acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
        out = acc / l[:, None]
        h = kvh * GROUP + g
        tl.store(O + b * stride_ob + h[:, None] * stride_oh + d[None, :], out.to(O.dtype.element_ty), mask=g_ok[:, None])

    if os.environ.get("TRITON_INTERPRET") != "1":
        _rope_paged_decode_kernel = triton.autotune(
            configs=[triton.Config({"BLOCK_N": n}, num_warps=w) for n, w in ((32, 4), (64, 4), (128, 4), (64, 8), (128, 8))],
            # rows_bucket: tuned per batch-size band. Tuned once at 64 rows and reused at 256, the
            # pick was sometimes 9% slower there (2.03 vs 1.86 ms per Qwen2.5-0.5B step, BENCHMARKS.md).
            key=["D", "GROUP_PAD", "BLOCK_SIZE", "rows_bucket"],
        )(_rope_paged_decode_kernel)

    @triton.jit
    def _rope_store_kernel(
        Q,
        K,
        V,
        COS,
        SIN,
        POS,
        SLOTS,
        Q_OUT,
        CK,
        CV,
        stride_qt,
        stride_qh,
        stride_kt,
        stride_kh,
        stride_vt,
        stride_vh,
        stride_ct,
        stride_ch,
        H: tl.constexpr,
        HKV: tl.constexpr,
        H_PAD: tl.constexpr,
        HKV_PAD: tl.constexpr,
        D: tl.constexpr,
    ):
        # One program = one token: rotate its q and k heads (HF rotate-half layout, float32 math),
        # write rotated q out, and store rotated k and plain v at the token's cache slot.
        t = tl.program_id(0).to(tl.int64)
        d = tl.arange(0, D)
        half: tl.constexpr = D // 2
        partner = (d + half) % D
        sign = tl.where(d < half, -1.0, 1.0)
        pos = tl.load(POS + t)
        cos = tl.load(COS + pos * D + d)[None, :]
        sin = tl.load(SIN + pos * D + d)[None, :]
        slot = tl.load(SLOTS + t)
        h = tl.arange(0, H_PAD)[:, None]
        hm = h < H
        q = tl.load(Q + t * stride_qt + h * stride_qh + d[None, :], mask=hm, other=0.0)
        qp = tl.load(Q + t * stride_qt + h * stride_qh + partner[None, :], mask=hm, other=0.0)
        qr = q.to(tl.float32) * cos + sign[None, :] * qp.to(tl.float32) * sin
        tl.store(Q_OUT + t * H * D + h * D + d[None, :], qr.to(Q_OUT.dtype.element_ty), mask=hm)
        g = tl.arange(0, HKV_PAD)[:, None]
        gm = g < HKV
        k = tl.load(K + t * stride_kt + g * stride_kh + d[None, :], mask=gm, other=0.0)
        kp = tl.load(K + t * stride_kt + g * stride_kh + partner[None, :], mask=gm, other=0.0)
        kr = k.to(tl.float32) * cos + sign[None, :] * kp.to(tl.float32) * sin
        tl.store(CK + slot * stride_ct + g * stride_ch + d[None, :], kr.to(CK.dtype.element_ty), mask=gm)
        v = tl.load(V + t * stride_vt + g * stride_vh + d[None, :], mask=gm, other=0.0)
        tl.store(CV + slot * stride_ct + g * stride_ch + d[None, :], v, mask=gm)

    @triton.jit
    def _mix32(x):
        x = ((x >> 16) ^ x) * 0x45D9F3B
        x = ((x >> 16) ^ x) * 0x45D9F3B
        return (x >> 16) ^ x

    @triton.jit
    def _log_fast(x, FAST: tl.constexpr):
        # Natural log; FAST: one MUFU lg2.approx (relative error ~2^-22) instead of libdevice's logf.
        if FAST:
            return 0.6931471805599453 * tl.inline_asm_elementwise(
                "lg2.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
            )
        else:
            return tl.log(x)

    @triton.jit
    def _gumbel(h, FAST: tl.constexpr):
        # uint32 hash -> float32 Gumbel noise, the same function as sampling.gumbel_noise: u from the
        # top 24 bits, clamped below 1 (16777215.5 rounds to 2**24); E = -log u from the series in
        # w = 1 - u near u = 1 (the fast log is inaccurate there), else from log(u <= 15/16).
        u = tl.minimum(((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), 0.99999994)
        w = 1.0 - u
        series = w * (1.0 + w * (0.5 + w * (0.33333334 + w * (0.25 + w * (0.2 + w * (0.16666667 + w * 0.14285715))))))
        e = tl.where(w < 0.0625, series, -_log_fast(u, FAST))
        return -_log_fast(e, FAST)

    @triton.jit
    def _gumbel_kernel(H, G, n, FAST: tl.constexpr, BLOCK: tl.constexpr):
        # noise_from_hash: the sampler's noise for given hash values (tests check it for every value)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        h = tl.load(H + offs, mask=ok, other=0).to(tl.uint32)
        tl.store(G + offs, _gumbel(h, FAST), mask=ok)

    @triton.jit
    def _sample_partial_kernel(
        LOGITS,
        SEEDS,
        POS,
        INV_T,
        PM,
        PS,
        PZ,
        PI,
        stride_l,
        V,
        V_SAMPLE,
        n_chunks,
        pos_offset,
        GREEDY: tl.constexpr,
        CHUNK: tl.constexpr,
        FAST: tl.constexpr,
    ):
        # Program (row, chunk): over CHUNK vocabulary entries, the max and sum-exp of x = logits / T
        # and the max of x + Gumbel noise with its index, for the combine kernel to merge. The row's
        # hash key is sampling.row_keys(seed, position) computed here (uint32 arithmetic = the
        # torch int64 version masked to 32 bits), so the step needs no separate key kernels.
        row = tl.program_id(0)
        c = tl.program_id(1)
        inv_t = tl.load(INV_T)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        ok = offs < V
        x = tl.load(LOGITS + row.to(tl.int64) * stride_l + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
        m = tl.max(x, 0)
        drawable = offs < V_SAMPLE  # ids past the tokenizer's length are never drawn (still in the normalizer)
        if GREEDY:
            zmax, i = tl.max(tl.where(drawable, x, float("-inf")), 0, return_indices=True)
        else:
            seed = tl.load(SEEDS + row).to(tl.uint32)  # int64 -> low 32 bits
            pos = (tl.load(POS + row) + pos_offset).to(tl.uint32)
            key = _mix32(_mix32(seed) ^ pos)
            h = _mix32(key ^ offs.to(tl.uint32))
            z = tl.where(drawable, x + _gumbel(h, FAST), float("-inf"))
            zmax, i = tl.max(z, 0, return_indices=True)
        out = row * n_chunks + c
        tl.store(PM + out, m)
        tl.store(PS + out, tl.sum(tl.exp(x - m), 0))
        tl.store(PZ + out, zmax)
        tl.store(PI + out, c * CHUNK + i)

    @triton.jit
    def _sample_combine_kernel(PM, PS, PZ, PI, LOGITS, INV_T, TOKENS, LOGPROBS, stride_l, n_chunks, C_PAD: tl.constexpr):
        row = tl.program_id(0)
        c = tl.arange(0, C_PAD)
        ok = c < n_chunks
        base = row * n_chunks
        m = tl.load(PM + base + c, mask=ok, other=float("-inf"))
        s = tl.load(PS + base + c, mask=ok, other=0.0)
        z = tl.load(PZ + base + c, mask=ok, other=float("-inf"))
        top = tl.max(m, 0)
        lse = top + tl.log(tl.sum(s * tl.exp(m - top), 0))
        best = tl.argmax(z, 0)
        tok = tl.sum(tl.where(c == best, tl.load(PI + base + c, mask=ok, other=0), 0), 0)
        # the chosen token's x, recomputed exactly as the partial kernel did
        x = tl.load(LOGITS + row.to(tl.int64) * stride_l + tok).to(tl.float32) * tl.load(INV_T)
        tl.store(TOKENS + row, tok.to(tl.int64))
        tl.store(LOGPROBS + row, x - lse)


def rope_and_store(q, k, v, cos_table, sin_table, positions, slots, cache_k, cache_v) -> torch.Tensor:
    """q (N, H, D), k/v (N, Hkv, D), positions/slots (N,), tables (P, D) float32, cache
    (blocks, block_size, Hkv, D) -> rotated q (N, H, D); rotated k and v go to the cache slots."""
    N, H, D = q.shape
    n_kv = k.shape[1]
    q_out = torch.empty(N, H, D, dtype=q.dtype, device=q.device)
    ck, cv = cache_k.view(-1, n_kv, D), cache_v.view(-1, n_kv, D)
    _rope_store_kernel[(N,)](
        q,
        k,
        v,
        cos_table,
        sin_table,
        positions,
        slots,
        q_out,
        ck,
        cv,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        ck.stride(0),
        ck.stride(1),
        H=H,
        HKV=n_kv,
        H_PAD=triton.next_power_of_2(H),
        HKV_PAD=triton.next_power_of_2(n_kv),
        D=D,
    )
    return q_out


def paged_decode(q, cache_k, cache_v, block_tables, context_lens) -> torch.Tensor:
    """Same contract as attention.paged_decode_reference: q (B, H, D) -> (B, H, D)."""
    B, H, D = q.shape
    n_kv = cache_k.shape[2]
    group = H // n_kv
    out = torch.empty_like(q)
    _paged_decode_kernel[(B, n_kv)](
        q,
        cache_k,
        cache_v,
        out,
        block_tables,
        context_lens,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        cache_k.stride(0),
        cache_k.stride(1),
        cache_k.stride(2),
        out.stride(0),
        out.stride(1),
        D**-0.5,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        D=D,
        D_PAD=max(16, triton.next_power_of_2(D)),
        BLOCK_SIZE=cache_k.shape[1],
        **PAGED_DEFAULTS,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 exact (tests); bf16 ignores it
    )
    return out


def fused_decode_supported(head_dim: int) -> bool:
    """Whether the engine uses rope_paged_decode: it needs a power-of-two head_dim of at least 16
    (tl.dot, no padding), and it is used up to head_dim 64 only. Measured on an H200 (BENCHMARKS.md):
    Qwen2.5-0.5B (head_dim 64) decodes 2% faster with it at 256 rows, Qwen2.5-1.5B (head_dim 128)
    9% slower (its q, k and fp32 accumulator per program cost occupancy)."""
    return 16 <= head_dim <= 64 and head_dim & (head_dim - 1) == 0


def rope_paged_decode(
    q, k, v, cos_table, sin_table, positions, slots, cache_k, cache_v, block_tables, context_lens
) -> torch.Tensor:
    """rope_and_store + paged_decode in one kernel: q (B, H, D), k/v (B, Hkv, D) of the new token
    (views with unit last stride), positions/slots (B,), context_lens (B,) = cached tokens + 1
    -> attention output (B, H, D); the rotated k and v land in the cache slots."""
    B, H, D = q.shape
    n_kv = cache_k.shape[2]
    group = H // n_kv
    out = torch.empty(B, H, D, dtype=q.dtype, device=q.device)
    _rope_paged_decode_kernel[(B, n_kv)](
        q,
        k,
        v,
        cos_table,
        sin_table,
        positions,
        slots,
        cache_k,
        cache_v,
        out,
        block_tables,
        context_lens,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        block_tables.stride(0),
        cache_k.stride(0),
        cache_k.stride(1),
        cache_k.stride(2),
        out.stride(0),
        out.stride(1),
        D**-0.5,
        (triton.next_power_of_2(B).bit_length() - 1) // 2,  # rows 1-2, 4-8, 16-32, 64-128, 256-512, ...
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        D=D,
        BLOCK_SIZE=cache_k.shape[1],
        **PAGED_DEFAULTS,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out


def _fast_math(t: torch.Tensor) -> bool:
    return t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"


def noise_from_hash(h: torch.Tensor) -> torch.Tensor:
    """The fused sampler's Gumbel noise for hash values h (int64 in [0, 2**32)): float32, same shape."""
    flat = h.reshape(-1).contiguous()
    out = torch.empty(flat.shape, dtype=torch.float32, device=h.device)
    block = 1024 if _fast_math(h) else 1 << 14  # the interpreter runs one program at a time
    _gumbel_kernel[(triton.cdiv(flat.numel(), block),)](flat, out, flat.numel(), FAST=_fast_math(h), BLOCK=block)
    return out.view(h.shape)


def fused_sample(
    logits,
    seeds,
    positions,
    inv_temperature,
    tokens_out,
    log_probs_out,
    greedy: bool,
    pos_offset: int = 0,
    chunk: int = 4096,
    vocab_limit: int | None = None,
) -> None:
    """logits (B, V) any float dtype; seeds, positions (B,) int64 (the row's hash key is
    sampling.row_keys(seeds, positions + pos_offset)); inv_temperature a 0-d float32 tensor (a device
    buffer, so a captured graph reads the current value); ids at or past `vocab_limit` are never drawn.

    Split over (row, vocabulary chunk) programs, then merged per row: one program per row
    walking 150k entries alone left most of the GPU idle (~250 us for 256 rows)."""
    B, V = logits.shape
    n_chunks = triton.cdiv(V, chunk)
    parts = torch.empty(3, B, n_chunks, dtype=torch.float32, device=logits.device)
    pi = torch.empty(B, n_chunks, dtype=torch.int32, device=logits.device)
    _sample_partial_kernel[(B, n_chunks)](
        logits,
        seeds,
        positions,
        inv_temperature,
        parts[0],
        parts[1],
        parts[2],
        pi,
        logits.stride(0),
        V,
        V if vocab_limit is None else min(V, vocab_limit),
        n_chunks,
        pos_offset,
        GREEDY=greedy,
        CHUNK=chunk,
        FAST=_fast_math(logits),
    )
    _sample_combine_kernel[(B,)](
        parts[0],
        parts[1],
        parts[2],
        pi,
        logits,
        inv_temperature,
        tokens_out,
        log_probs_out,
        logits.stride(0),
        n_chunks,
        C_PAD=max(2, triton.next_power_of_2(n_chunks)),
    )
