"""Prefix caching and chunked prefill in the native engine (`rollout.enable_prefix_caching`,
`rollout.enable_chunked_prefill`), each against the same engine without it, in one run: random
weights of a Qwen2.5 architecture, EOS ignored, sampling at temperature 1 with fixed seeds.

Command (one GPU):  PYTHONPATH=. python benchmarks/prefill_features.py --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/prefill_features.py --tiny --out /tmp/prefill_features

Prefix caching: --prompts prompts (x --n samples), each a system prompt of --system tokens shared
by all, then --unique tokens of its own. Timed (median of --repeats after a warm-up call): the
prefill alone (a generation of 1 token) and a generation of --new-tokens. Reported beside the
seconds: `rollout/prefix_cache_hit_rate` (the share of prompt tokens not recomputed) and the share
of responses equal to those of the engine without caching (in bf16 the shorter extend pass may
round a logit differently and change a sample; in float32 they are equal, tests/rollout).

Chunked prefill: --short prompts of --short-len tokens, then one prompt of --long tokens, longer
than --budget (`max_num_batched_tokens`). The short ones are admitted first and start decoding;
the long one follows. Without chunking it is prefilled in one pass while they wait; with it, one
chunk of --budget tokens between decode steps. Reported: `rollout/max_launch_gap_ms` (the longest
the running sequences waited between two decode steps), the call's seconds and
`rollout/prefill_chunks`. Prints a table; writes prefill_features.json to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rollout import MODELS, _Tok, hf_model, sync  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.dataset import PromptRecord, collate_prompts
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.native.engine import NativeRolloutEngine


def batch_of(rows: list[torch.Tensor], pad: int) -> Batch:
    """Left-padded prompts (the trainer's layout)."""
    records = [PromptRecord(r.tolist(), "", "bench", None, {}) for r in rows]
    return collate_prompts(records, pad, [str(i) for i in range(len(rows))])


def make_engine(trainer, name: str, device, max_model_len: int, max_num_seqs: int, **kw) -> NativeRolloutEngine:
    cfg = MODELS[name]
    engine = NativeRolloutEngine(
        trainer.config,
        _Tok(cfg["eos_token_id"], cfg["pad_token_id"]),
        device=device,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=0.2,
        ignore_eos=True,
        **kw,
    )
    engine.load_weights(trainer.named_parameters())
    return engine


def timed(engine, prompts: Batch, sampling: SamplingParams, seeds: list[int], repeats: int):
    """(median seconds, the last call's output and metrics) after one warm-up call."""
    engine.generate(prompts, sampling, seeds=seeds)
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        out = engine.generate(prompts, sampling, seeds=seeds)
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out, dict(engine.last_metrics)


def prefix_caching(a, name, trainer, device) -> list[dict]:
    vocab = MODELS[name]["vocab_size"]
    g = torch.Generator().manual_seed(0)
    system = torch.randint(2, vocab, (a.system,), generator=g)
    rows = [torch.cat([system, torch.randint(2, vocab, (a.unique,), generator=g)]) for _ in range(a.prompts)]
    prompts = batch_of(rows, MODELS[name]["pad_token_id"])
    seeds = list(range(a.prompts * a.n))
    engines = {
        on: make_engine(trainer, name, device, a.system + a.unique + a.new_tokens, a.prompts * a.n, prefix_caching=on)
        for on in (False, True)
    }
    result = []
    for new in (1, a.new_tokens):
        sampling = SamplingParams(n=a.n, temperature=1.0, max_new_tokens=new)
        outs = {}
        for on, engine in engines.items():
            seconds, outs[on], metrics = timed(engine, prompts, sampling, seeds, a.repeats)
            row = dict(
                feature="prefix_caching",
                on=on,
                new_tokens=new,
                seconds=seconds,
                prompt_tokens=a.prompts * (a.system + a.unique),
                hit_rate=metrics.get("rollout/prefix_cache_hit_rate", 0.0),
            )
            result.append(row)
        same = (outs[True][K.RESPONSES] == outs[False][K.RESPONSES]).all(-1).float().mean().item()
        result[-1]["same_responses"] = result[-2]["same_responses"] = same
        for row in result[-2:]:
            print(
                f"{name} prefix caching {'on ' if row['on'] else 'off'} | {a.prompts} prompts x {a.n} "
                f"({a.system} shared + {a.unique} own tokens), {new} new: {row['seconds']:.4f} s, "
                f"hit rate {row['hit_rate']:.3f}, same responses {same:.3f}",
                flush=True,
            )
    return result


def chunked_prefill(a, name, trainer, device) -> list[dict]:
    vocab = MODELS[name]["vocab_size"]
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(2, vocab, (a.short_len,), generator=g) for _ in range(a.short)]
    rows.append(torch.randint(2, vocab, (a.long,), generator=g))  # admitted after the short ones
    prompts = batch_of(rows, MODELS[name]["pad_token_id"])
    sampling = SamplingParams(n=1, temperature=1.0, max_new_tokens=a.new_tokens)
    seeds = list(range(len(rows)))
    result, outs = [], {}
    for on in (False, True):
        engine = make_engine(
            trainer,
            name,
            device,
            a.long + a.new_tokens,
            len(rows),
            chunked_prefill=on,
            max_num_batched_tokens=a.budget,
        )
        seconds, outs[on], metrics = timed(engine, prompts, sampling, seeds, a.repeats)
        row = dict(
            feature="chunked_prefill",
            on=on,
            seconds=seconds,
            max_launch_gap_ms=metrics["rollout/max_launch_gap_ms"],
            decode_ms=metrics["rollout/decode_ms_per_step"],
            prefill_chunks=metrics.get("rollout/prefill_chunks", 0.0),
        )
        result.append(row)
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    same = (outs[True][K.RESPONSES] == outs[False][K.RESPONSES]).all(-1).float().mean().item()
    for row in result:
        row["same_responses"] = same
        print(
            f"{name} chunked prefill {'on ' if row['on'] else 'off'} | {a.short} x {a.short_len} tokens decoding, "
            f"then 1 x {a.long} (budget {a.budget}), {a.new_tokens} new: {row['seconds']:.4f} s, "
            f"longest wait between decode steps {row['max_launch_gap_ms']:.2f} ms (a step {row['decode_ms']:.2f} ms), "
            f"{row['prefill_chunks']:.0f} chunk passes, same responses {same:.3f}",
            flush=True,
        )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, small shapes")
    p.add_argument("--out", default=None)
    p.add_argument("--models", nargs="*", default=["Qwen2.5-0.5B"])
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--system", type=int, default=1024, help="shared system-prompt tokens")
    p.add_argument("--unique", type=int, default=64, help="each prompt's own tokens after it")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--short", type=int, default=64, help="short prompts decoding when the long one arrives")
    p.add_argument("--short-len", type=int, default=256)
    p.add_argument("--long", type=int, default=16384)
    p.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens: the chunk length")
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    if a.tiny:
        a.models, a.prompts, a.n, a.system, a.unique, a.new_tokens = ["tiny"], 4, 2, 32, 8, 8
        a.short, a.short_len, a.long, a.budget, a.repeats = 3, 8, 64, 16, 1
    device = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    rows = []
    for name in a.models:
        trainer = hf_model(name, device)
        rows += prefix_caching(a, name, trainer, device)
        rows += chunked_prefill(a, name, trainer, device)
        for r in rows:
            r.setdefault("model", name)
        del trainer
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "settings": vars(a), "rows": rows}
        (Path(a.out) / "prefill_features.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
