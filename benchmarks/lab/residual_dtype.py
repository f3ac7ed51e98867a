"""The residual stream in float32 (fp32 weights under bf16 autocast: the one-GPU path) against bf16
(the embedding's output cast to bf16, as when FSDP2 computes with bf16 parameters) on the GRPO
step's passes: the update, the old log-prob pass and the reference pass, random weights of a
Qwen2.5 architecture, the GSM8K step's batch (benchmarks/shared_prompts.py).

Command (one GPU):  PYTHONPATH=. python benchmarks/lab/residual_dtype.py --models 0.5b --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/lab/residual_dtype.py --tiny

Each pass is timed with the two layouts alternately (one warm-up each, then --repeats rounds);
the old log-probs of the two are compared (the same weights: bf16 rounding of the residual only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: shared_prompts, update
from shared_prompts import batch_arguments, grpo_batch, make_worker, parse, save_rows  # noqa: E402
from update import ARCH, timed  # noqa: E402

from hybridrl.data import keys as K
from hybridrl.models.packing import base_model
from hybridrl.models.tiny import write_tiny_model_dir


def residual_in(models, dtype):
    """Cast each model's embedding output to `dtype` (None: leave it): returns the hook handles."""
    if dtype is None:
        return []
    return [base_model(m).get_decoder().embed_tokens.register_forward_hook(lambda mod, args, out: out.to(dtype)) for m in models]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_arguments(p, models="0.5b", update_budget=24576)
    a, device = parse(p)
    low = torch.bfloat16
    rows = []
    for name in a.models.split(","):
        model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **ARCH[name]))
        batch = grpo_batch(a.prompts, a.n, a.prompt_range, a.response_range, ARCH[name]["vocab_size"])
        w = make_worker(model_dir, a, device)
        models = [w.model, w.reference.model]
        passes = {
            "update_actor": lambda: w.update_actor(batch.select(list(batch.tensors))),
            "old_log_prob": lambda: w.compute_log_prob(batch.select(list(batch.tensors)))[K.OLD_LOG_PROBS],
            "ref": lambda: w.compute_ref_log_prob(batch.select(list(batch.tensors)))[K.REF_LOG_PROBS],
        }
        layouts = {"fp32": None, "bf16": low}
        lp = {}
        for layout, dtype in layouts.items():
            hooks = residual_in(models, dtype)
            lp[layout] = passes["old_log_prob"]()
            for h in hooks:
                h.remove()
        mask = batch[K.RESPONSE_MASK].bool()
        diff = (lp["bf16"] - lp["fp32"]).abs()[mask]
        row = {"model": name, "mean_abs_log_prob_diff": float(diff.mean()), "max_abs_log_prob_diff": float(diff.max())}
        print(f"{name}: old log-probs bf16 vs fp32 residual: mean |diff| {row['mean_abs_log_prob_diff']:.4g}", flush=True)
        for pass_name, fn in passes.items():
            times, mem = {k: [] for k in layouts}, {}
            for rnd in range(a.repeats + 1):  # the first round warms up (compiles each layout)
                for layout, dtype in layouts.items():
                    hooks = residual_in(models, dtype)
                    _, seconds, mem[layout] = timed(fn, device)
                    for h in hooks:
                        h.remove()
                    if rnd:
                        times[layout].append(seconds)
            med = {k: statistics.median(v) for k, v in times.items()}
            row[pass_name] = {"median_s": med, "all_s": times, "peak_gb": mem}
            print(
                f"{name} {pass_name}: fp32 residual {med['fp32']:.3f} s ({mem['fp32'] or 0:.1f} GB), "
                f"bf16 residual {med['bf16']:.3f} s ({mem['bf16'] or 0:.1f} GB)",
                flush=True,
            )
        rows.append(row)
    save_rows(a, device, rows, "residual_dtype.json")


if __name__ == "__main__":
    main()
