"""GRPO's passes with and without shared prompts (`actor_rollout_ref.model.share_prompts`).

Command (one GPU):  PYTHONPATH=. python benchmarks/shared_prompts.py --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/shared_prompts.py --tiny --out /tmp/shared_prompts

The worker code the trainer runs (`ActorRolloutRefWorker.update_actor`, `compute_log_prob`,
`compute_ref_log_prob`) on one GRPO-shaped batch: --prompts prompts x --n samples, each group's
rows repeating its prompt (--prompt-range tokens, left-padded), responses --response-range tokens
(uniform, right-padded), random token ids; Qwen2.5 architectures with random weights; fp32 master
weights + AdamW, bf16 autocast, compiled decoder layers, token-budget micro-batches (the GSM8K
recipe's budgets: 24,576 tokens for the update, 65,536 for the log-prob passes), --mini prompts
per optimizer step. The defaults are the GSM8K recipe's step (32 x 16, mini-batch 16 prompts;
GSM8K prompts are ~100-250 tokens with the chat template, responses ~200 on average).

Each pass runs shared and unshared alternately (--repeats times after one warm-up each; the
update's optimizer step changes the weights, which does not change the work); reported: median
seconds, the tokens the projections/MLPs computed, peak memory, and the largest difference between
the two ways' log-probs (bf16: rounding only) from the same weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from update import ARCH, ragged_batch, timed  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import sequence_lengths
from hybridrl.models.tiny import write_tiny_model_dir
from hybridrl.workers.actor import ActorRolloutRefWorker


def grpo_batch(prompts: int, n: int, prompt_range, response_range, vocab: int, seed: int = 0) -> Batch:
    """`prompts` groups of `n` rows with one prompt each (GRPO after repeat_interleave)."""
    base = ragged_batch(prompts, prompt_range, response_range, vocab, seed)
    rows = ragged_batch(prompts * n, prompt_range, response_range, vocab, seed + 1)
    for key in (K.PROMPTS, K.PROMPT_MASK):
        rows[key] = base[key].repeat_interleave(n, 0)
    rows[K.REF_LOG_PROBS] = rows[K.OLD_LOG_PROBS] - 0.01
    return rows


def make_worker(model_dir: str, a: argparse.Namespace, device: torch.device) -> ActorRolloutRefWorker:
    cfg = config_from_dict(
        {
            "data": {
                "train_files": "unused.jsonl",
                "train_batch_size": a.prompts,
                "max_prompt_length": a.prompt_range[1],
                "max_response_length": a.response_range[1],
            },
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {
                    "ppo_mini_batch_size": a.mini,
                    "use_dynamic_bsz": True,
                    "ppo_max_token_len_per_gpu": a.update_budget,
                    "use_kl_loss": True,
                    "kl_loss_type": "low_var_kl",
                    "optim": {"lr": 1e-6, "weight_decay": 0.0},
                    "use_cuda_graph": bool(getattr(a, "cuda_graph", False)),
                },
                "rollout": {"n": a.n, "log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": a.logprob_budget},
                "ref": {"log_prob_use_dynamic_bsz": True, "log_prob_max_token_len_per_gpu": a.logprob_budget},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"device": device.type},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(cfg, plan_batches(cfg), device)
    with device:
        w.init_model(model_dir, True, 1000, need_ref=True)
    w.freeze_reference()
    return w


def bench(name: str, a: argparse.Namespace, device: torch.device) -> dict:
    model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **ARCH[name]))
    batch = grpo_batch(a.prompts, a.n, a.prompt_range, a.response_range, ARCH[name]["vocab_size"])
    lengths = sequence_lengths(batch)
    unique_prompt_tokens = int(batch[K.PROMPT_MASK][:: a.n].sum())
    tokens = {"unshared": int(lengths.sum()), "shared": int(lengths.sum()) - (a.n - 1) * unique_prompt_tokens}
    w = make_worker(model_dir, a, device)
    passes = {
        "update_actor": lambda: w.update_actor(batch.select(list(batch.tensors))),
        "old_log_prob": lambda: w.compute_log_prob(batch.select(list(batch.tensors))),
        "ref": lambda: w.compute_ref_log_prob(batch.select(list(batch.tensors))),
    }
    row = {"model": name, "sequences": len(batch), "tokens": tokens, "passes": {}}
    # the same weights, both ways: the log-probs differ by bf16 rounding only
    lp = {}
    for share in (False, True):
        w.engine.share_prompts = w.reference.engine.share_prompts = share
        lp[share] = passes["old_log_prob"]()[K.OLD_LOG_PROBS]
    row["max_abs_log_prob_diff"] = float((lp[True] - lp[False]).abs().max())
    row["mean_abs_log_prob_diff"] = float((lp[True] - lp[False]).abs().sum() / batch[K.RESPONSE_MASK].sum())
    for pass_name, fn in passes.items():
        times, mem = {False: [], True: []}, {}
        for share in (False, True):  # warm-up (compilation for each layout)
            w.engine.share_prompts = w.reference.engine.share_prompts = share
            fn()
        for _ in range(a.repeats):
            for share in (False, True):
                w.engine.share_prompts = w.reference.engine.share_prompts = share
                _, seconds, mem[share] = timed(fn, device)
                times[share].append(seconds)
        med = {s: statistics.median(t) for s, t in times.items()}
        row["passes"][pass_name] = {
            "unshared_s": med[False],
            "shared_s": med[True],
            "speedup": med[False] / med[True],
            "all_s": {"unshared": times[False], "shared": times[True]},
            "peak_gb": {"unshared": mem[False], "shared": mem[True]},
        }
        speedup = med[False] / med[True]
        print(f"{name} {pass_name}: unshared {med[False]:.3f} s, shared {med[True]:.3f} s ({speedup:.2f}x)", flush=True)
    return row


def batch_arguments(p: argparse.ArgumentParser, models: str, update_budget: int) -> None:
    """The GRPO batch's and worker's options (also benchmarks/profile_passes.py's)."""
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 4 x 4 short sequences")
    p.add_argument("--models", default=models)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--mini", type=int, default=16, help="prompts per optimizer step")
    p.add_argument("--prompt-range", type=int, nargs=2, default=(100, 250))
    p.add_argument("--response-range", type=int, nargs=2, default=(20, 400))
    p.add_argument("--update-budget", type=int, default=update_budget)
    p.add_argument("--logprob-budget", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cuda-graph", action="store_true", help="actor.use_cuda_graph: the passes replay CUDA graphs")
    p.add_argument("--out", default="")


def tiny_settings(a: argparse.Namespace) -> None:
    """--tiny: a tiny model on 4 prompts x 4 short samples, one repeat."""
    a.models, a.prompts, a.n, a.mini, a.repeats = "tiny", 4, 4, 2, 1
    a.prompt_range, a.response_range, a.update_budget, a.logprob_budget = (4, 12), (2, 10), 64, 256


def parse(p: argparse.ArgumentParser) -> tuple[argparse.Namespace, torch.device]:
    """The parsed options (--tiny applied) and the device: CPU for --tiny or without a GPU."""
    a = p.parse_args()
    if a.tiny:
        tiny_settings(a)
    return a, torch.device("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")


def save_rows(a: argparse.Namespace, device: torch.device, rows: list, filename: str) -> None:
    """--out/filename: the device's name, the settings and the rows (nothing without --out)."""
    if not a.out:
        return
    Path(a.out).mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "settings": vars(a), "rows": rows}
    (Path(a.out) / filename).write_text(json.dumps(result, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_arguments(p, models="0.5b,1.5b", update_budget=24576)
    a, device = parse(p)
    rows = []
    for name in a.models.split(","):
        rows.append(bench(name, a, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print("| model | pass | unshared s | shared s | speedup | tokens computed (unshared -> shared) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        for pass_name, v in r["passes"].items():
            t = r["tokens"]
            print(
                f"| {r['model']} | {pass_name} | {v['unshared_s']:.3f} | {v['shared_s']:.3f} | {v['speedup']:.2f}x "
                f"| {t['unshared']:,} -> {t['shared']:,} |"
            )
        diff_max, diff_mean = r["max_abs_log_prob_diff"], r["mean_abs_log_prob_diff"]
        print(f"log-prob difference shared vs unshared ({r['model']}): max {diff_max:.2e}, mean {diff_mean:.2e}")
    save_rows(a, device, rows, "shared_prompts.json")


if __name__ == "__main__":
    main()
