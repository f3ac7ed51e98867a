"""Actor update and log-prob pass: hybridrl's packed path vs the naive padded HF path.

Command (one GPU):  PYTHONPATH=. python benchmarks/update.py --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/update.py --tiny --out /tmp/update_bench

Same worker code the trainer runs (`ActorRolloutRefWorker.update_actor` / `compute_log_prob`), on
the same ragged batch: 256 sequences, prompts 100-300 tokens (left-padded to 300), responses
20-1024 tokens (uniform; right-padded to 1024), random token ids; Qwen2.5-0.5B and -1.5B
architectures with random weights; fp32 master weights + AdamW, bf16 autocast; no activation
checkpointing; 4 optimizer steps of 64 sequences per update.

- hybridrl: use_remove_padding (packed rows, varlen attention), fused chunked LM-head log-probs,
  use_dynamic_bsz with --budget tokens per micro-batch (default 16384).
- baseline: use_remove_padding=false, fixed micro-batches over the padded (B, 1324) rows, logits
  of the R + 1 last positions, chunked log-softmax (the v0.1 path = plain HF forward), with the
  LARGEST micro-batch (power of two <= 64 sequences) that fits in memory, found by trying.

Reported per path: useful tokens/s (real prompt + response tokens / wall time; padding is not
useful), MFU (useful model FLOPs, hybridrl/tracking/perf.py, over the device's dense bf16 peak),
peak memory (torch.cuda.max_memory_allocated during the pass, weights and AdamW state included),
pad fraction. hybridrl runs eager ("packed-eager") and with the decoder layers compiled (its
default on CUDA); the baseline stays eager. Also: LoRA rank 32 vs full fine-tuning on 1.5B and
activation checkpointing (packed, compiled), packed attention kernels (--attn: varlen vs flex
vs SDPA rows, fwd + bwd of one 16k-token row).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import sequence_lengths
from hybridrl.models.prepare import compile_decoder_layers
from hybridrl.models.tiny import write_tiny_model_dir
from hybridrl.tracking import perf
from hybridrl.workers.actor import ActorRolloutRefWorker
from hybridrl.workers.forward import SEQ_KEYS

ARCH = {
    "0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=1000,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
}


def ragged_batch(n, prompt_range, response_range, vocab, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    P, R = prompt_range[1], response_range[1]
    plen = torch.randint(prompt_range[0], P + 1, (n,), generator=g)
    rlen = torch.randint(response_range[0], R + 1, (n,), generator=g)
    return Batch(
        {
            K.PROMPTS: torch.randint(2, vocab, (n, P), generator=g),
            K.PROMPT_MASK: (torch.arange(P)[None] >= P - plen[:, None]).long(),
            K.RESPONSES: torch.randint(2, vocab, (n, R), generator=g),
            K.RESPONSE_MASK: (torch.arange(R)[None] < rlen[:, None]).float(),
            K.OLD_LOG_PROBS: -torch.rand(n, R, generator=g) * 3,
            K.ADVANTAGES: torch.randn(n, R, generator=g),
        }
    )


def make_worker(model_dir, s, device, *, lora_rank=0, checkpointing=False):
    cfg = config_from_dict(
        {
            "data": {
                "train_files": "unused.jsonl",
                "train_batch_size": s["seqs"],
                "max_prompt_length": s["prompt"][1],
                "max_response_length": s["response"][1],
            },
            "actor_rollout_ref": {
                "model": {
                    "path": model_dir,
                    "random_init": True,
                    "lora_rank": lora_rank,
                    "lora_alpha": max(2 * lora_rank, 1),
                    "target_modules": "all-linear",
                    "enable_gradient_checkpointing": checkpointing,
                },
                "actor": {
                    "ppo_mini_batch_size": s["mini"],
                    "use_dynamic_bsz": True,
                    "ppo_max_token_len_per_gpu": s["budget"],
                    "use_torch_compile": False,  # compiled later, after the eager baseline ran
                    "optim": {"lr": 1e-6, "weight_decay": 0.0},
                },
            },
            "algorithm": {"adv_estimator": "reinforce_plus_plus"},
            "trainer": {"device": device.type},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(cfg, plan_batches(cfg), device)
    with device:  # build the random weights on the device directly
        w.init_model(model_dir, True, 100, need_ref=False)
    return w


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device):
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0, perf.max_memory_allocated_gb(device)


def set_padded(w, packed: bool, micro: int | None = None, lp_micro: int | None = None):
    """Switch one worker between the two paths (same weights, same optimizer)."""
    w.engine.packing = w._packing_backend if packed else None
    w.arr.actor.use_dynamic_bsz = packed
    w.arr.rollout.log_prob_use_dynamic_bsz = packed
    if micro:
        w.plan = dataclasses.replace(w.plan, actor=dataclasses.replace(w.plan.actor, micro_batch=micro))
    if lp_micro:
        w.plan = dataclasses.replace(w.plan, rollout_log_prob_micro_batch=lp_micro)


def is_oom(e: Exception) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e)


def largest_fitting(w, device, candidates, run) -> int | None:
    for m in candidates:
        try:
            run(m)
            return m
        except Exception as e:  # noqa: BLE001 - only OOM is expected
            if not is_oom(e):
                raise
            w.model.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
    return None


def bench_model(name, s, device, results, args):
    tmp = tempfile.mkdtemp()
    model_dir = str(write_tiny_model_dir(tmp, **ARCH[name]))
    batch = ragged_batch(s["seqs"], s["prompt"], s["response"], ARCH[name]["vocab_size"])
    real = float(sequence_lengths(batch).sum())
    targets = int(batch[K.RESPONSE_MASK].sum())
    w = make_worker(model_dir, s, device)
    w._packing_backend = w.engine.packing
    shape = perf.model_shape(w.model)
    peak = perf.device_peak_flops(device)
    fwd = perf.pass_flops(shape, sequence_lengths(batch), targets)
    warm = batch.index(list(range(s["mini"])))
    row = {
        "model": name,
        "sequences": s["seqs"],
        "real_tokens": real,
        "padded_slots": float(batch[K.PROMPTS].numel() + batch[K.RESPONSES].numel()),
        "backend": w.engine.packing,
    }

    def record(path, what, seconds, mem, flops, extra=None):
        r = {
            "path": path,
            "pass": what,
            "seconds": seconds,
            "tokens_per_s": real / seconds,
            "mfu": perf.mfu(flops, seconds, peak),
            "peak_gb": mem,
            **(extra or {}),
        }
        row.setdefault("runs", []).append(r)
        print(
            f"[{name}] {path:9s} {what:8s} {seconds:7.2f} s  {real / seconds:9.0f} tok/s  "
            f"MFU {r['mfu'] or 0:.3f}  peak {mem or 0:.1f} GB  {extra or ''}",
            flush=True,
        )
        dump(results, args.out)

    # baseline first, while the layers are not compiled: padded rows, the largest micro-batch that fits
    set_padded(w, False)
    cands = [m for m in (64, 32, 16, 8, 4, 2, 1) if m <= s["mini"]]
    micro = largest_fitting(w, device, cands, lambda m: (set_padded(w, False, micro=m), w.update_actor(warm)))
    row["baseline_update_micro"] = micro
    m, sec, mem = timed(lambda: w.update_actor(batch), device)
    record("padded", "update", sec, mem, 3 * fwd, {"pad_fraction": m["actor/pad_fraction"], "micro": micro})
    lp_micro = largest_fitting(
        w,
        device,
        [c for c in (256, 128, 64, 32, 16, 8, 4) if c <= s["seqs"]],
        lambda m: (set_padded(w, False, lp_micro=m), w.compute_log_prob(batch.index(list(range(m))).select(SEQ_KEYS))),
    )
    _, sec, mem = timed(lambda: w.compute_log_prob(batch.select(SEQ_KEYS)), device)
    record("padded", "logprob", sec, mem, fwd, {"micro": lp_micro})

    # Agreement of the two bf16 paths with a float32 padded reference (autocast off), 32 sequences.
    few = batch.index(list(range(min(32, len(batch))))).select(SEQ_KEYS)
    valid = few[K.RESPONSE_MASK].bool()
    set_padded(w, False, lp_micro=8)
    amp, w.engine.amp = w.engine.amp, None
    fp32 = w.compute_log_prob(few.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    w.engine.amp = amp
    padded_lp = w.compute_log_prob(few.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    set_padded(w, True)
    packed_lp = w.compute_log_prob(few.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    row["logprob_absdiff_vs_fp32"] = {
        path: {"mean": float((lp - fp32).abs()[valid].mean()), "max": float((lp - fp32).abs()[valid].max())}
        for path, lp in (("padded_bf16", padded_lp), ("packed_bf16", packed_lp))
    }
    print(f"[{name}] |log-prob - fp32 padded|: {row['logprob_absdiff_vs_fp32']}", flush=True)

    # hybridrl: packed + token budget, eager then with the decoder layers compiled (the default on CUDA)
    for path in ("eager", "compiled"):
        if path == "compiled":
            if device.type != "cuda":
                break
            compile_decoder_layers(w.model)
            _, csec, _ = timed(lambda: w.update_actor(warm), device)
            row["compile_warmup_s"] = csec
        else:
            w.update_actor(warm)
        label = "hybridrl" if path == "compiled" or device.type != "cuda" else "packed-eager"
        m, sec, mem = timed(lambda: w.update_actor(batch), device)
        record(label, "update", sec, mem, 3 * fwd, {"pad_fraction": m["actor/pad_fraction"]})
        w.compute_log_prob(warm.select(SEQ_KEYS))
        _, sec, mem = timed(lambda: w.compute_log_prob(batch.select(SEQ_KEYS)), device)
        record(label, "logprob", sec, mem, fwd)
    w = None  # free the model before the next one
    torch.cuda.empty_cache() if device.type == "cuda" else None

    variants = []
    if args.lora and name == args.lora:
        variants.append(("lora32", dict(lora_rank=32), 2 * fwd))
    if args.checkpointing and name == args.checkpointing:
        variants.append(("hybridrl+ckpt", dict(checkpointing=True), 3 * fwd))  # FLOPs without the recompute
    for label, kw, flops in variants:
        w = make_worker(model_dir, s, device, **kw)
        if device.type == "cuda":
            compile_decoder_layers(w.model)
        w.update_actor(warm)
        _, sec, mem = timed(lambda: w.update_actor(batch), device)
        record(label, "update", sec, mem, flops)
        w = None
        torch.cuda.empty_cache() if device.type == "cuda" else None
    results["models"].append(row)
    dump(results, args.out)


def bench_attention(device, results, args, total=16384, heads=(12, 2), dim=128):
    """fwd+bwd of one packed row of `total` tokens in sequences of 120-1324 tokens."""
    from hybridrl.models import packing

    g = torch.Generator().manual_seed(0)
    lens = []
    while sum(lens) < total:
        lens.append(int(torch.randint(120, 1325, (1,), generator=g)))
    lens[-1] -= sum(lens) - total
    cu = torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)
    q = torch.randn(total, heads[0], dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(total, heads[1], dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    mx = max(lens)

    def run(backend):
        if backend == "flex":
            mask = packing.document_block_mask(cu, total)
            rows = [x.transpose(0, 1)[None] for x in (q, k, v)]  # (1, H, N, D)
            out = packing._flex_attention()(*rows, block_mask=mask, enable_gqa=True)[0].transpose(0, 1)
        elif backend == "varlen":
            out = packing._varlen(q, k, v, cu, mx, None)
        else:
            out = packing._sdpa_padded(q, k, v, cu, mx, None)
        out.float().square().mean().backward()

    # Causal attention FLOPs (fwd 2 matmuls + bwd 5): 3.5 x 2 x L^2 x d_attn summed over sequences
    flops = 3.5 * 2 * sum(L * L for L in lens) * heads[0] * dim
    res = {}
    for backend in ("varlen", "flex", "sdpa"):
        try:
            for _ in range(2):
                run(backend)
            _, sec, _ = timed(lambda: [run(backend) for _ in range(5)], device)
            res[backend] = {"ms": sec / 5 * 1e3, "tflops": flops / (sec / 5) / 1e12}
        except Exception as e:  # noqa: BLE001 - a backend missing on this torch is a result too
            res[backend] = {"error": repr(e)[:300]}
        print(f"[attn] {backend}: {res[backend]}", flush=True)
    results["attention"] = res
    dump(results, args.out)


def dump(results, out):
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "update_bench.json").write_text(json.dumps(results, indent=2))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 16 short sequences")
    p.add_argument("--models", default="0.5b,1.5b")
    p.add_argument("--budget", type=int, default=16384, help="hybridrl: tokens per micro-batch")
    p.add_argument("--lora", default="1.5b", help="model to run LoRA rank 32 on ('' = skip)")
    p.add_argument("--checkpointing", default="1.5b", help="model to run with activation checkpointing ('' = skip)")
    p.add_argument("--attn", action="store_true", help="packed attention kernels: varlen vs flex vs SDPA rows")
    p.add_argument("--out", default="")
    args = p.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    if args.tiny:
        s = dict(seqs=16, mini=8, prompt=(5, 15), response=(2, 40), budget=200)
        models, args.lora = ["tiny"], "tiny" if args.lora else ""
        args.checkpointing = "tiny" if args.checkpointing else ""
    else:
        s = dict(seqs=256, mini=64, prompt=(100, 300), response=(20, 1024), budget=args.budget)
        models = args.models.split(",")
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "settings": s,
        "models": [],
    }
    import transformers

    results["transformers"] = transformers.__version__
    if args.attn and device.type == "cuda":
        bench_attention(device, results, args)
    for name in models:
        bench_model(name, s, device, results, args)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
