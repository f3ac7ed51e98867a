"""The packed passes' attention alone: each backend of `hybridrl.models.packing` on one GPU.

A packed micro-batch is one row of whole sequences (prompt + response) with causal attention
inside each. This builds such a row at the GSM8K step's shapes (prompts of ~108 tokens, responses
drawn from --response-range, up to --tokens tokens in the row, the unshared layout attention runs
on) and times the attention forward, and forward + backward, of

- varlen: FlashAttention-2's varlen kernels through aten, grouped KV heads as they are (the CUDA
          default, `packing._FlashVarlen`),
- torch_varlen: `torch.nn.attention.varlen.varlen_attn`, the same kernels through torch's custom op
          (torch 2.11 takes no GQA flag: the KV heads are repeated to Hq first; the default before),
- flex:   FlexAttention with the causal document mask, compiled as the trainer compiles it,
- sdpa:   SDPA over the sequences re-padded to rows (flash / cuDNN / efficient as torch picks),
- cudnn:  the same padded rows through the cuDNN backend alone,
- cudnn_ragged: cuDNN's fused attention on the packed row itself (ragged offsets, grouped KV heads
          as they are; `_rep`: repeated to Hq first).

Useful FLOPs are those of the causal blocks inside each sequence: 4 * d * H * L(L+1)/2 per sequence
for the forward, 2.5 times that for the backward. Outputs and gradients are compared with varlen.

    PYTHONPATH=. python benchmarks/lab/packed_attention.py --out OUT [--tokens 16384 65536] [--heads 14 2 64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from lm_head_kernels import timed  # noqa: E402  (median ms by CUDA events)

from hybridrl.models import packing  # noqa: E402


def lengths(tokens: int, prompt: int, lo: int, hi: int, gen: torch.Generator) -> list[int]:
    out = []
    while True:
        n = prompt + int(torch.randint(lo, hi + 1, (1,), generator=gen))
        if sum(out) + n > tokens:
            return out
        out.append(n)


def cudnn_padded(q, k, v, cu, max_len, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return packing._sdpa_padded(q, k, v, cu, max_len, scale)


def torch_varlen(q, k, v, cu, max_len, scale):
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    kw = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **kw)


class CudnnRagged(torch.autograd.Function):
    """cuDNN's fused attention over the packed row itself (ragged offsets, no padding)."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, scale):
        out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._cudnn_attention_forward(
            q, k, v, None, cu, cu, max_len, max_len, True, 0.0, True, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, cu, seed, offset)
        ctx.max_len, ctx.scale = max_len, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu, seed, offset = ctx.saved_tensors
        n = ctx.max_len
        dq, dk, dv = torch.ops.aten._cudnn_attention_backward(
            grad_out.contiguous(),
            q,
            k,
            v,
            out,
            lse,
            seed,
            offset,
            None,
            cu,
            cu,
            n,
            n,
            0.0,
            True,
            scale=ctx.scale,
        )
        return dq, dk, dv, None, None, None


def cudnn_ragged(q, k, v, cu, max_len, scale):
    return CudnnRagged.apply(q, k, v, cu, max_len, scale)


def cudnn_ragged_rep(q, k, v, cu, max_len, scale):
    rep = q.shape[1] // k.shape[1]
    return CudnnRagged.apply(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), cu, max_len, scale)


def run(tokens: int, hq: int, hkv: int, d: int, args, gen) -> list[dict]:
    dev = "cuda"
    lens = lengths(tokens, args.prompt, *args.response_range, gen)
    n = sum(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    max_len = max(lens)
    flops = 4 * d * hq * sum(L * (L + 1) // 2 for L in lens)
    scale = d**-0.5
    q0 = torch.randn(n, hq, d, device=dev, dtype=torch.bfloat16)
    k0 = torch.randn(n, hkv, d, device=dev, dtype=torch.bfloat16)
    v0 = torch.randn(n, hkv, d, device=dev, dtype=torch.bfloat16)
    grad = torch.randn(n, hq, d, device=dev, dtype=torch.bfloat16)

    mask = packing.document_block_mask(cu, n)

    def flex(q, k, v, cu, max_len, scale):
        out = packing._flex_attention()(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            block_mask=mask,
            scale=scale,
            enable_gqa=hq != hkv,
        )
        return out[0].transpose(0, 1)

    backends = {
        "varlen": packing._varlen,
        "torch_varlen": torch_varlen,
        "flex": flex,
        "sdpa": packing._sdpa_padded,
        "cudnn": cudnn_padded,
        "cudnn_ragged": cudnn_ragged,
        "cudnn_ragged_rep": cudnn_ragged_rep,
    }
    if args.only:
        backends = {k: v for k, v in backends.items() if k in args.only}
    ref_out = ref_grads = None
    rows = []
    for name, fn in backends.items():
        q, k, v = (x.clone().requires_grad_(True) for x in (q0, k0, v0))
        row = {"tokens": n, "sequences": len(lens), "max_len": max_len, "heads": [hq, hkv, d], "backend": name}
        try:
            with torch.no_grad():
                fwd = timed(lambda: fn(q, k, v, cu, max_len, scale), args.reps, warmup=3)

            def step():
                q.grad = k.grad = v.grad = None
                fn(q, k, v, cu, max_len, scale).backward(grad)

            both = timed(step, args.reps, warmup=3)
            out = fn(q, k, v, cu, max_len, scale)
            q.grad = k.grad = v.grad = None
            out.backward(grad)
            grads = [x.grad.float() for x in (q, k, v)]
        except Exception as e:  # a backend this build lacks is a row, not a crash
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            continue
        row.update(
            forward_ms=round(fwd, 3),
            forward_backward_ms=round(both, 3),
            forward_tflops=round(flops / fwd / 1e9, 1),
            forward_backward_tflops=round(3.5 * flops / both / 1e9, 1),
        )
        if ref_out is None:
            ref_out, ref_grads = out.float(), grads
        else:
            row["out_diff"] = float((out.float() - ref_out).abs().max())
            row["grad_diff"] = max(float((g - r).abs().max()) for g, r in zip(grads, ref_grads))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del out, grads
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--heads", type=int, nargs=3, action="append", help="q heads, kv heads, head dim (repeatable)")
    p.add_argument("--prompt", type=int, default=108)
    p.add_argument("--response-range", type=int, nargs=2, default=[40, 460])
    p.add_argument("--only", nargs="+", default=None)
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("packed_attention.py times CUDA kernels: run it on a GPU machine")
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    print("varlen_attn", inspect.signature(varlen_attn), flush=True)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for hq, hkv, d in args.heads or [[14, 2, 64]]:
        for t in args.tokens:
            rows += run(t, hq, hkv, d, args, gen)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "packed_attention.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
