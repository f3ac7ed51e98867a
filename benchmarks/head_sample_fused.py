"""A prototype, not used by the engine: the decode step's LM head and sampler as one Triton kernel.

Today a decode step computes the logits (rows x 152k) with cuBLAS, writes them, and the fused
sampler (`triton_kernels.fused_sample`) reads them back for the Gumbel-max draw and the log-sum-exp.
Here each program computes a (BLOCK_B rows x BLOCK_V vocabulary) tile of logits and reduces it
at once to the sampler's per-chunk partials (max, sum-exp, max of logit + noise, its index, and
its logit), so the logits never reach memory; a small kernel merges the partials per row. The
noise is the engine's (same hash of seed, position and token). The logits are rounded to bf16
before the draw, as the engine's are, but they come from another accumulation order than cuBLAS's,
so a token can differ where two scores nearly tie: the script reports how many match.

    PYTHONPATH=. python benchmarks/head_sample_fused.py [--rows 64 256] [--out OUT]

It times (CUDA graphs of 20 calls, median of 20 replays) cuBLAS + the engine's sampler against the
fused kernel at each of a few tile shapes, at Qwen2.5-0.5B's head (151,936 x 896).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_kernels import CFG, HIDDEN, time_us  # noqa: E402

from hybridrl.rollout.native import triton_kernels as kern  # noqa: E402

if kern.triton is not None:
    import triton
    import triton.language as tl

    _mix32, _log_fast = kern._mix32, kern._log_fast

    @triton.jit
    def _head_partial_kernel(
        H,
        W,
        SEEDS,
        POS,
        INV_T,
        PM,
        PS,
        PZ,
        PI,
        PX,
        B,
        V,
        K: tl.constexpr,
        stride_h,
        stride_w,
        n_chunks,
        BLOCK_B: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_K: tl.constexpr,
        FAST: tl.constexpr,
    ):
        pid_v = tl.program_id(0)
        pid_b = tl.program_id(1)
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        r_ok = rows < B
        c_ok = cols < V
        acc = tl.zeros((BLOCK_B, BLOCK_V), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            h = tl.load(H + rows[:, None] * stride_h + kk[None, :], mask=r_ok[:, None], other=0.0)
            w = tl.load(W + cols[:, None].to(tl.int64) * stride_w + kk[None, :], mask=c_ok[:, None], other=0.0)
            acc = tl.dot(h, tl.trans(w), acc)
        inv_t = tl.load(INV_T)
        # the engine's logits are bf16: round to nearest even by bits (the same on a GPU and in the
        # interpreter, whose float-to-bf16 cast differs)
        bits = acc.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True) * inv_t
        x = tl.where(c_ok[None, :], x, float("-inf"))
        m = tl.max(x, 1)
        s = tl.sum(tl.exp(x - m[:, None]), 1)
        seed = tl.load(SEEDS + rows, mask=r_ok, other=0).to(tl.uint32)
        pos = tl.load(POS + rows, mask=r_ok, other=0).to(tl.uint32)
        key = _mix32(_mix32(seed) ^ pos)
        hsh = _mix32(key[:, None] ^ cols[None, :].to(tl.uint32))
        u = ((hsh >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
        z = tl.where(c_ok[None, :], x - _log_fast(-_log_fast(u, FAST), FAST), float("-inf"))
        zmax, zi = tl.max(z, 1, return_indices=True)
        xsel = tl.sum(tl.where(tl.arange(0, BLOCK_V)[None, :] == zi[:, None], x, 0.0), 1)
        out = rows * n_chunks + pid_v
        tl.store(PM + out, m, mask=r_ok)
        tl.store(PS + out, s, mask=r_ok)
        tl.store(PZ + out, zmax, mask=r_ok)
        tl.store(PI + out, pid_v * BLOCK_V + zi, mask=r_ok)
        tl.store(PX + out, xsel, mask=r_ok)

    @triton.jit
    def _head_combine_kernel(PM, PS, PZ, PI, PX, TOKENS, LOGPROBS, n_chunks, C_PAD: tl.constexpr):
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
        x = tl.sum(tl.where(c == best, tl.load(PX + base + c, mask=ok, other=0.0), 0.0), 0)
        tl.store(TOKENS + row, tok.to(tl.int64))
        tl.store(LOGPROBS + row, x - lse)


def fused_head_sample(h, w, seeds, pos, inv_t, tok, lp, block_b: int, block_v: int, block_k: int, warps: int, stages: int):
    B, K = h.shape
    V = w.shape[0]
    n_chunks = triton.cdiv(V, block_v)
    parts = torch.empty(4, B, n_chunks, dtype=torch.float32, device=h.device)
    pi = torch.empty(B, n_chunks, dtype=torch.int32, device=h.device)
    _head_partial_kernel[(n_chunks, triton.cdiv(B, block_b))](
        h,
        w,
        seeds,
        pos,
        inv_t,
        parts[0],
        parts[1],
        parts[2],
        pi,
        parts[3],
        B,
        V,
        K,
        h.stride(0),
        w.stride(0),
        n_chunks,
        BLOCK_B=block_b,
        BLOCK_V=block_v,
        BLOCK_K=block_k,
        FAST=h.is_cuda,
        num_warps=warps,
        num_stages=stages,
    )
    _head_combine_kernel[(B,)](
        parts[0], parts[1], parts[2], pi, parts[3], tok, lp, n_chunks, C_PAD=triton.next_power_of_2(n_chunks)
    )


def run(rows: list[int], bw: float) -> list[dict]:
    V = CFG["vocab_size"]
    torch.manual_seed(0)
    w = torch.randn(V, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    out = []
    for M in rows:
        h = torch.randn(M, HIDDEN, device="cuda", dtype=torch.bfloat16) * 4
        seeds = torch.randint(0, 2**31, (M,), device="cuda")
        pos = torch.randint(0, 1000, (M,), device="cuda")
        inv_t = torch.ones((), device="cuda")
        tok0, lp0 = torch.empty(M, dtype=torch.int64, device="cuda"), torch.empty(M, device="cuda")
        tok1, lp1 = torch.empty_like(tok0), torch.empty_like(lp0)

        def engine():
            kern.fused_sample(F.linear(h, w), seeds, pos, inv_t, tok0, lp0, False)

        row = dict(rows=M, floor_us=w.numel() * 2 / bw * 1e6, engine_us=time_us(engine), configs=[])
        engine()
        for bb, bv, bk, warps, stages in itertools.product((64, 128), (64, 128, 256), (64, 128), (4, 8), (3, 4)):
            if bb > max(64, triton.next_power_of_2(M)) or bb * bv > 128 * 256:
                continue
            args = (h, w, seeds, pos, inv_t, tok1, lp1, bb, bv, bk, warps, stages)
            try:
                us = time_us(lambda args=args: fused_head_sample(*args))
            except Exception as e:  # noqa: BLE001  (a tile shape this GPU cannot fit is a row, not a crash)
                row["configs"].append(dict(cfg=[bb, bv, bk, warps, stages], error=str(e)[:100]))
                continue
            fused_head_sample(*args)
            torch.cuda.synchronize()
            same = float((tok0 == tok1).float().mean())
            lp_err = float((lp0 - lp1).abs().max())
            row["configs"].append(dict(cfg=[bb, bv, bk, warps, stages], us=us, tokens_equal=same, logprob_maxdiff=lp_err))
        ok = [c for c in row["configs"] if "us" in c]
        row["best"] = min(ok, key=lambda c: c["us"]) if ok else None
        print(json.dumps({k: v for k, v in row.items() if k != "configs"}), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="*", type=int, default=[64, 256])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available() or kern.triton is None:
        sys.exit("head_sample_fused.py times CUDA kernels: it needs a CUDA device and Triton")
    from rollout import copy_bandwidth

    bw = copy_bandwidth(torch.device("cuda"))
    res = dict(device=torch.cuda.get_device_name(), copy_gb_s=bw / 1e9, rows=run(args.rows, bw))
    print("\n| rows | weight-read floor us | cuBLAS + engine sampler us | fused best us (tile) | tokens equal | lp max diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in res["rows"]:
        b = r["best"] or {}
        print(
            f"| {r['rows']} | {r['floor_us']:.1f} | {r['engine_us']:.1f} | {b.get('us', float('nan')):.1f} ({b.get('cfg')}) "
            f"| {b.get('tokens_equal', float('nan')):.3f} | {b.get('logprob_maxdiff', float('nan')):.2e} |"
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "head_sample_fused.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
