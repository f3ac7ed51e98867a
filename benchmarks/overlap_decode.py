"""Can the log-prob passes run while the engine decodes? Generation alone, K reference passes alone,
and both at once (the passes in a thread on a CUDA stream of their own, generation on the current
stream or on a high-priority one; with --green-sms, the passes on a green context's stream that
runs on that many SMs only), random weights of a Qwen2.5 architecture.

Command (one GPU):  PYTHONPATH=. python benchmarks/overlap_decode.py --models 0.5b --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/overlap_decode.py --tiny

Random weights almost never sample EOS, so every sequence runs `--new-tokens`: `--gen-prompts`
sets how many decode at once (the GSM8K step's batch early on, its tail later). The overlap's gain
is `alone_gen + alone_passes - together`, the work hidden; the table gives each run's seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from contextlib import nullcontext

import torch
from rollout import make_prompts  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from shared_prompts import batch_arguments, grpo_batch, make_worker, parse, save_rows  # noqa: E402
from update import ARCH  # noqa: E402

from hybridrl.models.tiny import write_tiny_model_dir
from hybridrl.rollout import SamplingParams


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_arguments(p, models="0.5b", update_budget=16384)
    p.add_argument("--gen-prompts", type=int, nargs="+", default=[32, 4], help="prompts (x n samples) decoding at once")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--passes", type=int, default=1, help="reference passes over the GRPO batch per run")
    p.add_argument(
        "--green-sms",
        type=int,
        nargs="*",
        default=[],
        help="also run the passes on a green context's stream confined to this many SMs (torch.cuda.green_contexts)",
    )
    p.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval (s) for the overlapped runs")
    a, device = parse(p)
    if a.switch_interval:
        sys.setswitchinterval(a.switch_interval)
    if a.tiny:
        a.gen_prompts, a.new_tokens = [2], 8
    name = a.models.split(",")[0]
    model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **ARCH[name]))
    a.response_range = (a.response_range[0], max(a.response_range[1], a.new_tokens))
    w = make_worker(model_dir, a, device)
    if a.green_sms:  # one KV cache for the whole run: no decode graph is captured while a pass runs
        w.arr.rollout.free_cache_engine = False
    batch = grpo_batch(a.prompts, a.n, a.prompt_range, (a.response_range[0], 400 if not a.tiny else 10), ARCH[name]["vocab_size"])
    side = torch.cuda.Stream(device) if device.type == "cuda" else None
    high = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
    greens = {}
    for k in a.green_sms if device.type == "cuda" else []:
        from torch.cuda.green_contexts import GreenContext

        greens[k] = GreenContext.create(num_sms=k, device_id=device.index or 0)
    green_streams = {k: g.Stream() for k, g in greens.items()}

    def passes():
        for _ in range(a.passes):
            w.compute_ref_log_prob(batch.select(list(batch.tensors)))

    rows = []
    for gp in a.gen_prompts:
        prompts = make_prompts(gp, 110, ARCH[name]["vocab_size"])
        sampling = SamplingParams(n=a.n, temperature=1.0, max_new_tokens=a.new_tokens)

        def gen(stream=None):
            ctx = torch.cuda.stream(stream) if stream is not None else nullcontext()
            with ctx:
                w.generate(prompts, sampling)
            sync(device)

        def in_thread(stream):
            ctx = torch.cuda.stream(stream) if stream is not None else nullcontext()
            with ctx:
                passes()
            sync(device)

        def together(gen_stream=None, pass_stream=None):
            t = threading.Thread(target=in_thread, args=(pass_stream or side,))
            t0 = time.perf_counter()
            t.start()
            gen(gen_stream)
            gen_s = time.perf_counter() - t0
            t.join()
            return gen_s

        def timed(fn):
            sync(device)
            t0 = time.perf_counter()
            extra = fn()
            return time.perf_counter() - t0, extra

        gen(), passes(), together()  # warm-up: graphs, compiled layers, allocator
        for gs in green_streams.values():
            in_thread(gs), together(None, gs)
        res: dict[str, list] = {"gen": [], "passes": [], "together": [], "together_gen": [], "prio": [], "prio_gen": []}
        for k in green_streams:
            res.update({f"green{k}_passes": [], f"green{k}": [], f"green{k}_gen": []})
        for _ in range(a.repeats):
            res["gen"].append(timed(gen)[0])
            res["passes"].append(timed(passes)[0])
            wall, g = timed(together)
            res["together"].append(wall), res["together_gen"].append(g)
            wall, g = timed(lambda: together(high))
            res["prio"].append(wall), res["prio_gen"].append(g)
            for k, gs in green_streams.items():
                res[f"green{k}_passes"].append(timed(lambda gs=gs: in_thread(gs))[0])
                wall, g = timed(lambda gs=gs: together(None, gs))
                res[f"green{k}"].append(wall), res[f"green{k}_gen"].append(g)
        med = {k: statistics.median(v) for k, v in res.items()}
        row = {"sequences": gp * a.n, "new_tokens": a.new_tokens, **med, "all": res}
        hidden = med["gen"] + med["passes"] - med["together"]
        hidden_p = med["gen"] + med["passes"] - med["prio"]
        print(
            f"{name} {gp * a.n} seqs x {a.new_tokens}: gen {med['gen']:.3f} s, {a.passes} ref passes {med['passes']:.3f} s | "
            f"together {med['together']:.3f} s (gen done at {med['together_gen']:.3f}; hidden {hidden:.3f}) | "
            f"gen on a high-priority stream {med['prio']:.3f} s (gen {med['prio_gen']:.3f}; hidden {hidden_p:.3f})",
            flush=True,
        )
        for k in green_streams:
            hidden_g = med["gen"] + med["passes"] - med[f"green{k}"]
            print(
                f"  passes on {k} SMs (green context): alone {med[f'green{k}_passes']:.3f} s | together {med[f'green{k}']:.3f} s "
                f"(gen done at {med[f'green{k}_gen']:.3f}; hidden {hidden_g:.3f} of the full-GPU pass)",
                flush=True,
            )
        rows.append(row)
    save_rows(a, device, rows, "overlap_decode.json")


if __name__ == "__main__":
    main()
