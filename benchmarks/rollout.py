"""Rollout throughput: the native engine vs HF `generate`, same weights and prompts, one run.

Command (one GPU):  PYTHONPATH=. python benchmarks/rollout.py --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/rollout.py --tiny --out /tmp/rollout_bench
Where decode time goes: add `--profile 64` (kernel tables with and without CUDA graphs, and the
share of the wall time the device is busy, per row; files profile_<model>_x<prompts>_*.txt).

For each model (Qwen2.5-0.5B and 1.5B architectures, random weights) and each batch (64 and 256
prompts of 256 random tokens), both engines generate 512 new tokens per prompt with EOS ignored
(HF: min_new_tokens = max_new_tokens), sampling at temperature 1, top-p 1, top-k off.
- tokens/s: new tokens / wall time of the whole generate call (prefill included), after one
  warm-up call (the native engine captures its CUDA graphs there);
- decode ms/step: native: the engine's own per-step time (host work included); HF: (wall time -
  prefill time) / (new tokens - 1), the prefill timed as a 1-token generate;
- floor ms/step: bytes one decode step must read (bf16 weights once + the K/V of every sequence
  at the mean context length) / the copy bandwidth measured here (a 1 GiB device-to-device copy);
- tokens sha256: a digest of the native engine's tokens (two trees that behave the same agree);
- peak memory: torch.cuda.max_memory_allocated during the timed call (it includes the HF model
  kept for the baseline, listed beside it);
- switch time: an fp32 "trainer" model on the same GPU; wake() + load_weights(all parameters,
  fp32 -> bf16 copy in place) + sleep(), median of 5.
- `--prompt-len`, `--new-tokens`: other shapes, e.g. `--new-tokens 4096` or 16384 for R1-style
  response lengths (with `--no-hf`);
- `--steps 1 8`: the native engine with 1 and with 8 decode steps per launch
  (`rollout.decode_steps_per_sync`), each a row (baseline in the same run).
Prints a table and writes rollout_bench.json to --out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hybridrl.data import keys as K  # noqa: E402
from hybridrl.data.batch import Batch  # noqa: E402
from hybridrl.rollout import SamplingParams  # noqa: E402
from hybridrl.rollout.native.engine import NativeRolloutEngine  # noqa: E402

COMMON = dict(
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    architectures=["Qwen2ForCausalLM"],
    eos_token_id=151643,
    pad_token_id=151643,
)
MODELS = {
    "Qwen2.5-0.5B": dict(
        COMMON, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864
    ),
    "Qwen2.5-1.5B": dict(
        COMMON, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960
    ),
    "Qwen2.5-7B": dict(
        COMMON,
        vocab_size=152064,
        tie_word_embeddings=False,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
    ),
    "tiny": dict(
        COMMON,
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        eos_token_id=1,
        pad_token_id=0,
    ),
}


class _Tok:
    """Just what the engines need from a tokenizer (ids in, ids out): no vocabulary files."""

    def __init__(self, eos, pad):
        self.eos_token_id, self.pad_token_id = eos, pad

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [" ".join(map(str, s.tolist())) for s in seqs]


def hf_model(name: str, device):
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**MODELS[name])
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.eval()


def make_prompts(n: int, length: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(n)
    ids = torch.randint(2, vocab, (n, length), generator=g)
    return Batch({K.PROMPTS: ids, K.PROMPT_MASK: torch.ones_like(ids)}, {K.UID: [str(i) for i in range(n)]})


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(device) -> float:
    """Bytes/s of a device-to-device copy (read + write counted)."""
    if device.type != "cuda":
        return float("nan")
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    sync()
    return 2 * 10 * x.numel() / (time.perf_counter() - t)


def floor_ms(engine, n_seqs: int, mean_ctx: float, bandwidth: float) -> float:
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    m, cfg = engine.model, engine.runner.hf_config
    kv = n_seqs * mean_ctx * cfg.num_hidden_layers * 2 * m.n_kv_heads * m.head_dim * 2  # bf16 K and V
    return 1000 * (weights + kv) / bandwidth


def run_native(engine, prompts, new_tokens):
    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens)
    # The warm-up is the timed call's shape: the batch passes every size of the graph ladder while
    # the prompts are admitted and captures each once. (A 4-token warm-up ended before the batch
    # was whole, so the timed call captured the largest graphs itself: ~0.55 s counted as decode.)
    engine.generate(prompts, s)
    sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    out = engine.generate(prompts, s)
    sync()
    wall = time.perf_counter() - t
    tokens = int(out[K.RESPONSE_MASK].sum())
    assert tokens == len(prompts) * new_tokens, "EOS was not ignored"
    captures = engine.last_metrics.get("rollout/graph_captures", 0.0)
    assert captures == 0, f"the timed call captured {captures:.0f} CUDA graphs: the warm-up missed a batch size"
    # the tokens' digest: two trees that behave the same draw the same tokens (issue 42's rule)
    digest = hashlib.sha256(out[K.RESPONSES].cpu().numpy().tobytes()).hexdigest()[:16]
    print(f"native x{len(prompts)}: tokens sha256 {digest}", flush=True)
    return dict(
        tokens_sha256=digest,
        tokens_per_s=tokens / wall,
        decode_ms=engine.last_metrics["rollout/decode_ms_per_step"],
        wall_s=wall,
        peak_gb=torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else float("nan"),
    )


def run_hf(model, prompts, new_tokens, device):
    ids, mask = prompts[K.PROMPTS].to(device), prompts[K.PROMPT_MASK].to(device)

    def gen(n):
        sync()
        t = time.perf_counter()
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
        )
        sync()
        return time.perf_counter() - t, out

    gen(2)  # warm-up
    prefill, _ = gen(1)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    wall, out = gen(new_tokens)
    assert out.shape[1] - ids.shape[1] == new_tokens
    tokens = len(prompts) * new_tokens
    return dict(
        tokens_per_s=tokens / wall,
        decode_ms=1000 * (wall - prefill) / (new_tokens - 1),
        wall_s=wall,
        peak_gb=torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else float("nan"),
    )


def switch_time(engine, trainer_model) -> float:
    times = []
    for _ in range(5):
        sync()
        t = time.perf_counter()
        engine.wake()
        engine.load_weights(trainer_model.named_parameters())
        engine.sleep()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile_decode(engine, prompts, steps: int, out: Path, tag: str, eager: bool = True) -> dict:
    """One short generate under torch.profiler, with CUDA graphs and without: the kernels by
    device time (the eager table names them) and the device-busy share of the wall time (with
    graphs: what is left to gain by fusing kernels vs by removing gaps between them)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=steps)
    res = {}
    graphs = engine.use_graphs
    for mode, use_graphs in (("graphs", graphs), ("eager", False))[: 2 if eager else 1]:
        engine.runner.use_graphs = use_graphs
        engine.generate(prompts, s)  # warm-up (graph capture, Triton compiles)
        sync()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            t = time.perf_counter()
            engine.generate(prompts, s)
            sync()
            wall = time.perf_counter() - t
        events = prof.key_averages()
        device_us = sum(e.self_device_time_total for e in events) if cuda else float("nan")
        table = events.table(sort_by=sort, row_limit=30)
        (out / f"profile_{tag}_{mode}.txt").write_text(table + "\n")
        res[mode] = dict(
            wall_ms=1000 * wall,
            device_busy_ms=device_us / 1000,
            busy=device_us / 1e6 / wall if cuda else float("nan"),
            decode_ms=engine.last_metrics["rollout/decode_ms_per_step"],
        )
        print(f"profile {tag} {mode}: {res[mode]}\n{table}", flush=True)
    engine.runner.use_graphs = graphs
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny config")
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--batches", nargs="*", type=int, default=None)
    ap.add_argument("--no-hf", action="store_true", help="skip the HF generate baseline")
    ap.add_argument(
        "--steps", nargs="*", type=int, default=[None], help="decode steps per launch to compare (default: the engine's)"
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="also profile a STEPS-token generate per row (with and without CUDA graphs): kernel tables "
        "in --out, device-busy share of the wall time",
    )
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 256; 16 with --tiny)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens generated per prompt (default 512; 32 with --tiny)")
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    models = args.models or (["tiny"] if args.tiny else ["Qwen2.5-0.5B", "Qwen2.5-1.5B"])
    batches = args.batches or ([4, 8] if args.tiny else [64, 256])
    prompt_len, new_tokens = (16, 32) if args.tiny else (256, 512)
    prompt_len, new_tokens = args.prompt_len or prompt_len, args.new_tokens or new_tokens
    Path(args.out).mkdir(parents=True, exist_ok=True)
    bw = copy_bandwidth(device)
    results = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        copy_bandwidth_gb_s=bw / 1e9,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        rows=[],
        switch={},
    )
    print(f"device {results['device']}, copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    for name in models:
        trainer = hf_model(name, device)  # fp32, as the trainer holds it
        cfg = MODELS[name]
        engines = {}
        for steps in args.steps:
            engines[steps] = NativeRolloutEngine(
                trainer.config,
                _Tok(cfg["eos_token_id"], cfg["pad_token_id"]),
                device=device,
                max_model_len=prompt_len + new_tokens,
                max_num_seqs=max(batches),
                gpu_memory_utilization=0.5 / len(args.steps),
                ignore_eos=True,
                decode_steps_per_sync=steps,
            )
            engines[steps].load_weights(trainer.named_parameters())
        engine = engines[args.steps[0]]
        results["switch"][name] = switch_time(engine, trainer)
        print(
            f"{name}: switch (wake + load_weights fp32->{engine.dtype} + sleep) {1000 * results['switch'][name]:.1f} ms",
            flush=True,
        )
        baseline = trainer.to(torch.bfloat16) if device.type == "cuda" else trainer  # same weights, in place
        for b in batches:
            prompts = make_prompts(b, prompt_len, cfg["vocab_size"])
            for i, (steps, engine) in enumerate(engines.items()):
                row = dict(
                    model=name, prompts=b, steps=engine.runner.decode_steps, native=run_native(engine, prompts, new_tokens)
                )
                row["floor_ms"] = floor_ms(engine, b, prompt_len + new_tokens / 2, bw)
                row["kv_cache_gb"] = engine.cache.data.numel() * engine.cache.data.element_size() / 1e9
                row["kv_used_gb"] = engine.last_metrics["rollout/kv_cache_usage"] * row["kv_cache_gb"]  # at the peak
                print(f"{name} x{b} steps/launch {row['steps']}: native {row['native']}", flush=True)
                if args.profile:
                    tag = f"{name}_x{b}_s{row['steps']}"
                    row["profile"] = profile_decode(engine, prompts, args.profile, Path(args.out), tag, eager=i == 0)
                if not args.no_hf and i == 0:
                    row["hf"] = run_hf(baseline, prompts, new_tokens, device)
                    row["speedup"] = row["native"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
                    print(f"{name} x{b}: hf {row['hf']}", flush=True)
                results["rows"].append(row)
        del engine, engines, trainer, baseline
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(
        "\n| model | prompts | steps/launch | native tok/s | HF tok/s | speedup | native decode ms/step | floor ms/step "
        "| x floor | GPU busy | HF decode ms/step | native peak GB | HF peak GB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results["rows"]:
        n, h = r["native"], r.get("hf", {})
        busy = r.get("profile", {}).get("graphs", {}).get("busy", float("nan"))
        print(
            f"| {r['model']} | {r['prompts']} | {r['steps']} | {n['tokens_per_s']:.0f} | "
            f"{h.get('tokens_per_s', float('nan')):.0f} | "
            f"{r.get('speedup', float('nan')):.1f}x | {n['decode_ms']:.2f} | {r['floor_ms']:.2f} | "
            f"{n['decode_ms'] / r['floor_ms']:.1f} | {busy:.0%} | "
            f"{h.get('decode_ms', float('nan')):.1f} | {n['peak_gb']:.2f} | {h.get('peak_gb', float('nan')):.2f} |"
        )
    for name, t in results["switch"].items():
        print(f"switch time {name}: {1000 * t:.1f} ms")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollout_bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
