"""The decode step's kernels one at a time, against their memory floor (issue 20).

A decode step of Qwen2.5-0.5B at 256 rows is ~25 kernels per layer-stack pass; this times each
kind alone at the step's shapes, replayed from a CUDA graph (no launch gaps), so that the step's
excess over its floor can be attributed: the four projections, the fused attention at several
context lengths, and the elementwise kernels. For the projections it also times alternatives:
cuBLASLt instead of cuBLAS, split-K through a batched GEMM (partials in float32, then summed),
and Inductor's max-autotune (Triton templates) where --inductor is given. Two more sections,
chosen with --only: `attention_configs` times the fused attention at every (BLOCK_N, warps,
stages) beside the autotuner's pick, and `head` times the LM head's GEMM and the fused sampler
(Gumbel-max and greedy, at several vocabulary chunk sizes) against a plain read of the logits.

    PYTHONPATH=. python benchmarks/decode_kernels.py --out OUT [--rows 64 256] [--inductor]
    PYTHONPATH=. python benchmarks/decode_kernels.py --out OUT --only attention_configs head
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rollout import MODELS, copy_bandwidth  # noqa: E402  (the benchmarks' model shapes, the floor's bandwidth)

CFG = MODELS["Qwen2.5-0.5B"]
HIDDEN, INTER = CFG["hidden_size"], CFG["intermediate_size"]
HEADS, KV_HEADS = CFG["num_attention_heads"], CFG["num_key_value_heads"]
HEAD_DIM = HIDDEN // HEADS
SHAPES = {  # name: (in, out, bias) of the fused projections
    "qkv": (HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, True),
    "o": (HIDDEN, HIDDEN, False),
    "gate_up": (HIDDEN, 2 * INTER, False),
    "down": (INTER, HIDDEN, False),
}


def time_us(fn, reps: int = 20, inner: int = 20) -> float:
    """Median microseconds per call of fn, from CUDA graphs of `inner` calls (after a warm-up)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1000 * a.elapsed_time(b) / inner)
    return statistics.median(times)


def split_k(x, w, splits: int):
    """x (M, K) @ w (N, K)^T as `splits` GEMMs over slices of K in one batched call, float32 partials."""
    M, K = x.shape
    N = w.shape[0]
    xs = x.view(M, splits, K // splits).transpose(0, 1)  # (S, M, K/S)
    ws = w.view(N, splits, K // splits).permute(1, 2, 0)  # (S, K/S, N)
    try:
        parts = torch.bmm(xs, ws, out_dtype=torch.float32)
    except (RuntimeError, TypeError):  # a torch without bmm's out_dtype: bf16 partials
        parts = torch.bmm(xs, ws).float()
    return parts.sum(0).to(x.dtype)


def gemms(rows: list[int], inductor: bool, bw: float) -> list[dict]:
    out = []
    dev = "cuda"
    for M in rows:
        for name, (k, n, bias) in SHAPES.items():
            x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            b = torch.randn(n, device=dev, dtype=torch.bfloat16) if bias else None
            floor = (w.numel() + x.numel() + M * n) * 2 / bw * 1e6
            ref = F.linear(x.double(), w.double(), None if b is None else b.double())
            row = dict(rows=M, proj=name, k=k, n=n, floor_us=floor, gflop=2 * M * k * n / 1e9)
            row["cublas_us"] = time_us(lambda: F.linear(x, w, b))
            torch.backends.cuda.preferred_blas_library("cublaslt")
            row["cublaslt_us"] = time_us(lambda: F.linear(x, w, b))
            torch.backends.cuda.preferred_blas_library("cublas")
            for s in (2, 4, 8):
                if k % s == 0 and (k // s) % 8 == 0:

                    def f(s=s):
                        y = split_k(x, w, s)
                        return y if b is None else y + b

                    err = (f().double() - ref).abs().max().item()
                    row[f"splitk{s}_us"] = time_us(f)
                    row[f"splitk{s}_maxerr"] = err
            row["cublas_maxerr"] = (F.linear(x, w, b).double() - ref).abs().max().item()
            if inductor:
                c = torch.compile(lambda x, w, b: F.linear(x, w, b), mode="max-autotune-no-cudagraphs", dynamic=False)
                row["inductor_us"] = time_us(lambda: c(x, w, b))
                row["inductor_maxerr"] = (c(x, w, b).double() - ref).abs().max().item()
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


BLOCK_SIZE = 16  # the engine's KV-cache block


def attention_inputs(B: int, ctx: int, bs: int = BLOCK_SIZE, head_major: bool = False) -> tuple:
    """rope_paged_decode's arguments for B rows at context `ctx`: q, k, v of the new token, the
    rope tables, positions, slots, a K/V cache over shuffled blocks, block tables, lengths.
    `head_major`: each block stores its KV heads one after the other, (blocks, Hkv, bs, D), passed
    to the kernel as a (blocks, bs, Hkv, D) view (its reads take any strides; its store of the new
    token assumes the engine's layout, so with this layout it lands elsewhere: timing only)."""
    from transformers import Qwen2Config

    from hybridrl.models.llama import rope_tables

    H, n_kv, D = HEADS, KV_HEADS, HEAD_DIM
    per = -(-ctx // bs)  # blocks per row
    blocks = B * per + 1
    if head_major:
        ck = torch.randn(blocks, n_kv, bs, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    else:
        ck = torch.randn(blocks, bs, n_kv, D, device="cuda", dtype=torch.bfloat16)
    cv = torch.randn_like(ck)
    tables = (1 + torch.randperm(blocks - 1, device="cuda")[: B * per]).view(B, per).int()
    lens = torch.full((B,), ctx, device="cuda", dtype=torch.int32)
    pos = lens.long() - 1
    slots = tables.long().gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
    qkv = torch.randn(B, (H + 2 * n_kv) * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = (t.view(B, -1, D) for t in qkv.split([H * D, n_kv * D, n_kv * D], -1))
    cos, sin = (t.cuda() for t in rope_tables(Qwen2Config(rope_theta=1e6), D, ctx + 1))
    return q, k, v, cos, sin, pos, slots, ck, cv, tables, lens


def attention(rows: list[int], contexts: list[int], bw: float) -> list[dict]:
    from hybridrl.rollout.native import triton_kernels as kern

    n_kv, D = KV_HEADS, HEAD_DIM
    out = []
    for B in rows:
        for ctx in contexts:
            args = attention_inputs(B, ctx)
            us = time_us(lambda: kern.rope_paged_decode(*args))
            kv_bytes = B * (ctx - 1) * n_kv * D * 2 * 2
            row = dict(rows=B, ctx=ctx, us=us, kv_mb=kv_bytes / 1e6, floor_us=kv_bytes / bw * 1e6, gb_s=kv_bytes / us / 1e3)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def elementwise(rows: list[int], bw: float) -> list[dict]:
    from hybridrl.models.triton_ops import fused_add_rms_norm, silu_mul

    out = []
    for M in rows:
        gu = torch.randn(M, 2 * INTER, device="cuda", dtype=torch.bfloat16)
        res, delta = (torch.randn(M, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        wn = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
        for name, fn, nbytes in (
            ("silu_mul", lambda: silu_mul(gu), gu.numel() * 2 * 1.5),
            ("add_rms_norm", lambda: fused_add_rms_norm(res, delta, wn, 1e-6), res.numel() * 2 * 4),
        ):
            us = time_us(fn)
            row = dict(rows=M, kernel=name, us=us, floor_us=nbytes / bw * 1e6)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def attention_configs(rows: list[int], ctx: int) -> list[dict]:
    """The fused decode attention at every (BLOCK_N, warps, stages) its autotuner could be given."""
    from hybridrl.rollout.native import triton_kernels as kern

    H, n_kv, D, bs = HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE
    fn = kern._rope_paged_decode_kernel.fn  # the jit function under the autotuner
    out = []
    for B in rows:
        q, k, v, cos, sin, pos, slots, ck, cv, tables, lens = attention_inputs(B, ctx)
        o = torch.empty_like(q)
        auto = time_us(lambda: kern.rope_paged_decode(q, k, v, cos, sin, pos, slots, ck, cv, tables, lens))
        row = dict(rows=B, ctx=ctx, autotuned_us=auto, configs=[])
        for bn, nw_, st in [(n, w, s) for n in (16, 32, 64, 128) for w in (2, 4, 8) for s in (1, 2, 3, 4)]:

            def f(bn=bn, nw_=nw_, st=st):
                fn[(B, n_kv)](
                    q, k, v, cos, sin, pos, slots, ck, cv, o, tables, lens,
                    q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                    tables.stride(0), ck.stride(0), ck.stride(1), ck.stride(2), o.stride(0), o.stride(1),
                    D**-0.5, 0, GROUP=H // n_kv, GROUP_PAD=16, D=D, BLOCK_SIZE=bs, BLOCK_N=bn,
                    PRECISION="tf32", num_warps=nw_, num_stages=st,
                )  # fmt: skip

            try:
                us = time_us(f)
            except Exception as e:
                row["configs"].append(dict(block_n=bn, warps=nw_, stages=st, error=str(e)[:80]))
                continue
            row["configs"].append(dict(block_n=bn, warps=nw_, stages=st, us=us))
        row["best"] = min((c for c in row["configs"] if "us" in c), key=lambda c: c["us"])
        print(json.dumps({k: v for k, v in row.items() if k != "configs"}), flush=True)
        out.append(row)
    return out


def head(rows: list[int], bw: float) -> list[dict]:
    """The LM head GEMM and the fused sampler (chunk sizes) at Qwen2.5-0.5B's vocabulary."""
    from hybridrl.rollout.native import triton_kernels as kern

    V = CFG["vocab_size"]
    w = torch.randn(V, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    out = []
    for M in rows:
        h = torch.randn(M, HIDDEN, device="cuda", dtype=torch.bfloat16)
        logits = F.linear(h, w)
        seeds = torch.randint(0, 2**31, (M,), device="cuda")
        pos = torch.randint(0, 1000, (M,), device="cuda")
        inv_t = torch.ones((), device="cuda")
        tok = torch.empty(M, dtype=torch.int64, device="cuda")
        lp = torch.empty(M, dtype=torch.float32, device="cuda")
        row = dict(rows=M, lm_head_us=time_us(lambda: F.linear(h, w)))
        row["lm_head_floor_us"] = (w.numel() + logits.numel()) * 2 / bw * 1e6
        row["logits_read_floor_us"] = logits.numel() * 2 / bw * 1e6
        row["amax_us"] = time_us(lambda: logits.amax(-1))
        for chunk in (1024, 2048, 4096, 8192, 16384):
            for greedy in (False, True):
                row[f"sample_{'greedy' if greedy else 't1'}_{chunk}_us"] = time_us(
                    lambda: kern.fused_sample(logits, seeds, pos, inv_t, tok, lp, greedy, chunk=chunk)
                )
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def attention_layouts(rows: list[int], contexts: list[int], bw: float) -> list[dict]:
    """The fused decode attention over KV caches of other layouts: blocks of 16 or 64 tokens, each
    block token-major (the engine's: a token's KV heads side by side) or head-major."""
    from hybridrl.rollout.native import triton_kernels as kern

    out = []
    for B in rows:
        for ctx in contexts:
            kv_bytes = B * (ctx - 1) * KV_HEADS * HEAD_DIM * 2 * 2
            row = dict(rows=B, ctx=ctx, floor_us=kv_bytes / bw * 1e6)
            for bs in (16, 64):
                for head_major in (False, True):
                    args = attention_inputs(B, ctx, bs, head_major)
                    key = f"bs{bs}_{'head' if head_major else 'token'}_us"
                    row[key] = time_us(lambda args=args: kern.rope_paged_decode(*args))
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rows", nargs="*", type=int, default=[64, 256])
    ap.add_argument("--contexts", nargs="*", type=int, default=[128, 384, 640])
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="sections to run: gemms attention elementwise attention_layouts attention_configs head",
    )
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_kernels.py times CUDA kernels from CUDA graphs: it needs a CUDA device")
    bw = copy_bandwidth(torch.device("cuda"))  # read + write bytes per second, as rollout.py's floor
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    res = dict(device=torch.cuda.get_device_name(), copy_gb_s=bw / 1e9)
    only = set(args.only or ("gemms", "attention", "elementwise"))
    if "gemms" in only:
        res["gemms"] = gemms(args.rows, args.inductor, bw)
        print("\n| rows | projection | floor us | cuBLAS us | cuBLASLt us | split-K 2 / 4 / 8 us | Inductor us |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in res["gemms"]:
            sk = " / ".join(f"{r.get(f'splitk{s}_us', float('nan')):.1f}" for s in (2, 4, 8))
            print(
                f"| {r['rows']} | {r['proj']} | {r['floor_us']:.1f} | {r['cublas_us']:.1f} | {r['cublaslt_us']:.1f} | {sk} "
                f"| {r.get('inductor_us', float('nan')):.1f} |"
            )
    if "attention" in only:
        res["attention"] = attention(args.rows, args.contexts, bw)
        print("\n| rows | context | attention us | K/V MB | floor us | GB/s |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in res["attention"]:
            print(f"| {r['rows']} | {r['ctx']} | {r['us']:.1f} | {r['kv_mb']:.1f} | {r['floor_us']:.1f} | {r['gb_s']:.0f} |")
    if "elementwise" in only:
        res["elementwise"] = elementwise(args.rows, bw)
        print("\n| rows | kernel | us | floor us |")
        print("| --- | --- | --- | --- |")
        for r in res["elementwise"]:
            print(f"| {r['rows']} | {r['kernel']} | {r['us']:.1f} | {r['floor_us']:.1f} |")
    if "attention_layouts" in only:
        res["attention_layouts"] = attention_layouts(args.rows, args.contexts, bw)
        print(
            "\n| rows | context | floor us | block 16, token-major (engine) us | block 16, head-major us "
            "| block 64, token-major us | block 64, head-major us |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in res["attention_layouts"]:
            print(
                f"| {r['rows']} | {r['ctx']} | {r['floor_us']:.1f} | {r['bs16_token_us']:.1f} | {r['bs16_head_us']:.1f} "
                f"| {r['bs64_token_us']:.1f} | {r['bs64_head_us']:.1f} |"
            )
    if "attention_configs" in only:
        res["attention_configs"] = attention_configs(args.rows, 512)
        for r in res["attention_configs"]:
            print(f"attention rows {r['rows']} ctx {r['ctx']}: autotuned {r['autotuned_us']:.1f} us, best {r['best']}")
    if "head" in only:
        res["head"] = head(args.rows, bw)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "decode_kernels.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
