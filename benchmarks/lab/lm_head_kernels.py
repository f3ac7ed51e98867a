"""The LM head's log-prob function alone (`hybridrl.models.logprobs.fused_log_probs`), A/B on one GPU.

The trainer's passes end in fused_log_probs over every response token: the (tokens, hidden) final
hidden states times the (vocab, hidden) head, chunk by chunk, to log-probs (and entropy), and
the backward over slices of the vocabulary. This times it at Qwen2.5-0.5B's head (152k x 896) for
the row counts of the GSM8K step (a 16,384-token update micro-batch, a 65,536-token log-prob
pass), forward alone and forward + backward, for each variant:

- torch: the softmax algebra compiled by Inductor (the code before the Triton kernels),
- triton: `hybridrl.models.logprob_kernels` (one read of the logits for the statistics),
- triton+addmm: also the row gradient accumulated in float32 inside the GEMM.

Values are compared with the torch variant (log-probs, entropy, gradients); --float64 also compares
each variant with a float64 computation on 4,096 tokens. The kernel sweep (skipped with --no-sweep)
times each kernel alone on one chunk at several block shapes, against the chunk's read floor at the
copy bandwidth measured on a buffer of the same size.

    PYTHONPATH=. python benchmarks/lab/lm_head_kernels.py --out OUT [--rows 16384 65536] [--no-sweep] [--float64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hybridrl.models import logprobs  # noqa: E402

VARIANTS = {"torch": (False, False), "triton": (True, False), "triton+addmm": (True, True)}


def timed(fn, reps: int, warmup: int = 1) -> float:
    """Median ms of `reps` calls of `fn` (CUDA events), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def kernel_sweep(vocab: int, reps: int) -> list[dict]:
    """The two kernels alone on one chunk, at several block shapes, against the compiled torch
    functions and the read (+ write) floor of the chunk."""
    from hybridrl.models import logprob_kernels as k

    dev = "cuda"
    out = []
    bw = None
    z = torch.randn(883, vocab, device=dev, dtype=torch.bfloat16) * 3  # a forward chunk: 2**27 elements
    labels = torch.randint(0, vocab, (883,), device=dev)
    x = torch.empty(z.numel() // 2, device=dev)  # copy bandwidth on the same buffer size
    bw = 2 * x.numel() * 4 / timed(lambda: x.copy_(torch.empty_like(x)), reps) / 1e6  # GB/s
    stats_t = logprobs._maybe_compiled(logprobs._chunk_stats, z.device)
    row = dict(kernel="stats", shape=list(z.shape), floor_ms=z.numel() * 2 / bw / 1e6)
    for ent in (False, True):
        row[f"torch_ent{int(ent)}_ms"] = timed(lambda: stats_t(z, labels, 1.0, ent), reps)
        for block in (2048, 4096, 8192):
            for parts in (0, 2, 4, 8):
                for warps in (4, 8):
                    row[f"triton_ent{int(ent)}_b{block}_p{parts}_w{warps}_ms"] = timed(
                        lambda: k.logit_stats(z, labels, 1.0, ent, block=block, parts=parts, num_warps=warps), reps
                    )
    print(json.dumps(row), flush=True)
    out.append(row)
    zs = torch.randn(16384, 8192, device=dev, dtype=torch.bfloat16) * 3  # a backward slice at 16,384 rows
    lab = torch.randint(-8192, 2 * 8192, (16384,), device=dev)
    lse = torch.logsumexp(zs.float(), -1) + 2
    ent, glp, gent = (torch.randn(16384, device=dev) for _ in range(3))
    grad_t = logprobs._maybe_compiled(logprobs._chunk_grad, zs.device)
    row = dict(kernel="grad", shape=list(zs.shape), floor_ms=2 * zs.numel() * 2 / bw / 1e6)
    for e in (None, gent):
        tag = "ent1" if e is not None else "ent0"
        row[f"torch_{tag}_ms"] = timed(lambda: grad_t(zs, lab, lse, ent, glp, e, 1.0), reps)
        want = grad_t(zs, lab, lse, ent, glp, e, 1.0)
        for br, bc in ((16, 512), (8, 1024), (32, 256), (4, 2048), (64, 128)):
            f = lambda: k.logit_grad(zs, lab, lse, ent, glp, e, 1.0, block_r=br, block_c=bc)  # noqa: E731
            row[f"triton_{tag}_{br}x{bc}_ms"] = timed(f, reps)
            row[f"triton_{tag}_{br}x{bc}_maxdiff"] = (f().float() - want.float()).abs().max().item()
    print(json.dumps(row), flush=True)
    out.append(row)
    return out


def float64_check(hidden_size: int, vocab: int, n: int = 4096) -> list[dict]:
    """Each variant's log-probs and gradients against float64, on n tokens and the full head."""
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = (torch.randn(n, hidden_size, device="cuda", generator=g) * 2).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device="cuda", generator=g) / hidden_size**0.5).requires_grad_()
    labels = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    coef = torch.randn(n, device="cuda", generator=g)
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    lp0 = torch.log_softmax(h64 @ w64.T, -1).gather(1, labels[:, None])[:, 0]
    gh0, gw0 = torch.autograd.grad((coef.double() * lp0).sum(), [h64, w64])
    del h64, w64
    out = []
    for name, (triton, addmm) in VARIANTS.items():
        logprobs.USE_TRITON, logprobs.GRAD_H_ADDMM = triton, addmm
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lp, _, _ = logprobs.fused_log_probs(hidden, weight, labels)
        gh, gw = torch.autograd.grad((coef * lp).sum(), [hidden, weight])
        row = dict(
            variant=name,
            tokens=n,
            logp_max_err=(lp.double() - lp0).abs().max().item(),
            grad_h_rel_err=((gh.double() - gh0).norm() / gh0.norm()).item(),
            grad_w_rel_err=((gw.double() - gw0).norm() / gw0.norm()).item(),
        )
        print(json.dumps(row), flush=True)
        out.append(row)
    logprobs.USE_TRITON, logprobs.GRAD_H_ADDMM = True, True
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rows", nargs="*", type=int, default=[16384, 65536])
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sweep-only", action="store_true", help="only the kernels' block-shape sweep")
    ap.add_argument("--no-sweep", action="store_true", help="skip the kernels' block-shape sweep")
    ap.add_argument("--float64", action="store_true", help="also each variant's error against float64 (4,096 tokens)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("lm_head_kernels.py times CUDA kernels: it needs a CUDA device")
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    weight = (torch.randn(args.vocab, args.hidden, device=dev, generator=g) / args.hidden**0.5).requires_grad_()
    res = dict(device=torch.cuda.get_device_name(), hidden=args.hidden, vocab=args.vocab, rows=[])
    res["kernels"] = [] if args.no_sweep else kernel_sweep(args.vocab, args.reps)
    if args.float64:
        res["float64"] = float64_check(args.hidden, args.vocab)
    if args.sweep_only:
        args.rows = []
    for n in args.rows:
        hidden = (torch.randn(n, args.hidden, device=dev, generator=g) * 2).requires_grad_()
        labels = torch.randint(0, args.vocab, (n,), device=dev, generator=g)
        coef = torch.randn(n, device=dev, generator=g)
        for entropy in (False, True):
            row = dict(rows=n, entropy=entropy, logits_gb=n * args.vocab * 2 / 1e9)
            ref = None
            for name, (triton, addmm) in VARIANTS.items():
                logprobs.USE_TRITON, logprobs.GRAD_H_ADDMM = triton, addmm

                def fwd():
                    with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
                        return logprobs.fused_log_probs(hidden, weight, labels, with_entropy=entropy)

                def fwd_bwd():
                    with torch.autocast(dev, dtype=torch.bfloat16):
                        lp, ent, _ = logprobs.fused_log_probs(hidden, weight, labels, with_entropy=entropy)
                    loss = (coef * lp).sum() + (0.01 * (coef * ent).sum() if entropy else 0)
                    return torch.autograd.grad(loss, [hidden, weight]), lp, ent

                (gh, gw), lp, ent = fwd_bwd()
                if ref is None:
                    ref = (gh, gw, lp, ent)
                err = dict(
                    logp_maxdiff=(lp - ref[2]).abs().max().item(),
                    grad_h_rel=((gh - ref[0]).norm() / ref[0].norm()).item(),
                    grad_w_rel=((gw - ref[1]).norm() / ref[1].norm()).item(),
                )
                if entropy:
                    err["entropy_maxdiff"] = (ent - ref[3]).abs().max().item()
                row[name] = dict(fwd_ms=timed(fwd, args.reps), fwd_bwd_ms=timed(fwd_bwd, args.reps), **err)
                print(json.dumps(dict(rows=n, entropy=entropy, variant=name, **row[name])), flush=True)
            res["rows"].append(row)
    logprobs.USE_TRITON, logprobs.GRAD_H_ADDMM = True, True
    print("\n| rows | entropy | logits GB | variant | forward ms | forward + backward ms | log-prob diff | grad diff h / w |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in res["rows"]:
        for name in VARIANTS:
            v = r[name]
            print(
                f"| {r['rows']} | {r['entropy']} | {r['logits_gb']:.1f} | {name} | {v['fwd_ms']:.1f} | {v['fwd_bwd_ms']:.1f} "
                f"| {v['logp_maxdiff']:.1e} | {v['grad_h_rel']:.1e} / {v['grad_w_rel']:.1e} |"
            )
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "lm_head_kernels.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
