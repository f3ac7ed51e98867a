"""DPO throughput: hybridrl's PreferenceTrainer vs TRL's DPOTrainer, same model, data and settings.

Command (one GPU; the GPU machine lacks trl/datasets/dill/multiprocess, so carry their wheels):
    python -m pip install --no-deps .wheels/*.whl && PYTHONPATH=. python benchmarks/dpo.py --steps 30 --warmup 5 --out $OUT
CPU smoke test (tiny model, 96 pairs, 3 steps, step 1 = warm-up):
    PYTHONPATH=. python benchmarks/dpo.py --tiny --out /tmp/dpo_bench

Measures, for each trainer in its own subprocess (so peak memory is its own): pairs/s (32 pairs per
optimizer step / median step time over the steps after the warm-up steps), peak GPU memory
(torch.cuda.max_memory_allocated), and the last step's loss and rewards/accuracies. Prints a table
and writes $OUT/dpo_bench.json. Settings shared by both: Qwen2.5-0.5B architecture with identical
random weights (saved once, loaded by both), 1,000 synthetic char-level pairs (prompt 100-300
tokens, chosen/rejected 50-400 tokens + EOS; nothing is truncated), 32 pairs per step in micro-batches
of 8 pairs (chosen+rejected in one forward: 16 sequences), AdamW lr 1e-6 constant, weight decay 0,
grad clip 1.0, beta 0.1, sigmoid loss, bf16 autocast over fp32 weights, no gradient checkpointing,
reference log-probs from a frozen fp32 copy, computed on the fly every step.

Floor (count first, METHOD.md): ~850 tokens per pair (2 x (200 + 226)) x 8N FLOPs (6N policy fwd+bwd +
2N reference fwd, N = 494M incl. the tied LM head) = 3.4 TFLOP/pair -> ~4.3 ms/pair at ~790 TFLOP/s: at most
~230 pairs/s, before padding (~1.5x more tokens padded) and MFU; bytes per step (fp32 weights read ~3x per
micro-batch, grads, AdamW state: ~50 GB) / ~4.3 TB/s = ~12 ms vs ~140 ms of FLOPs: compute-bound.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, cell, run_child, versions  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

QWEN05 = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def settings(args) -> dict:
    s = dict(
        model=TINY if args.tiny else QWEN05,
        pairs=args.pairs or (96 if args.tiny else 1000),
        prompt_len=(10, 30) if args.tiny else (100, 300),
        completion_len=(5, 40) if args.tiny else (50, 400),
        steps=args.steps or (3 if args.tiny else 10),
        warmup=args.warmup if args.warmup is not None else (1 if args.tiny else 2),
        batch=32,
        micro=8,
        lr=1e-6,
        beta=0.1,
        seed=1,
        device="cpu" if args.tiny else "cuda",
    )
    s["max_prompt_length"] = s["prompt_len"][1]
    s["max_response_length"] = s["completion_len"][1] + 1  # + EOS
    s["max_length"] = 1024 if not args.tiny else 128  # TRL: prompt + completion; never reached here
    assert s["max_prompt_length"] + s["max_response_length"] <= s["max_length"]
    # One epoch must cover every step: TRL's last step of an epoch takes only the leftover micro-batches.
    assert s["pairs"] >= s["steps"] * s["batch"], f"--pairs must be >= steps x {s['batch']}"
    return s


# -- shared inputs ---------------------------------------------------------------------------------------------------
def prepare(work: Path, s: dict) -> tuple[Path, Path]:
    """Model dir (config, char tokenizer, random fp32 weights) and a JSONL of pairs, both seeded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hybridrl.models.tiny import CHARS, write_tiny_model_dir

    model_dir = write_tiny_model_dir(work / "model", **s["model"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=torch.float32)
    model.save_pretrained(model_dir)  # both trainers load these weights (hybridrl: random_init=false)
    n_params = sum(p.numel() for p in model.parameters())
    del model

    rng = random.Random(1234)
    alphabet = [c for c in CHARS if c != "\n"]

    def text(lo_hi):
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(*lo_hi)))

    data = work / "pairs.jsonl"
    with data.open("w") as f:
        for _ in range(s["pairs"]):
            row = {"prompt": text(s["prompt_len"]), "chosen": text(s["completion_len"]), "rejected": text(s["completion_len"])}
            f.write(json.dumps(row) + "\n")
    print(f"[dpo-bench] model {n_params / 1e6:.1f}M params -> {model_dir}; {s['pairs']} pairs -> {data}", flush=True)
    return model_dir, data


def memory(device: str) -> dict:
    import torch

    if device != "cuda":
        return {"peak_mem_gb": None, "peak_reserved_gb": None}
    return {
        "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30,
        "peak_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
    }


def summarize(step_s: list[float], s: dict) -> dict:
    timed = step_s[s["warmup"] :] or step_s
    med = statistics.median(timed)
    return {"step_s": step_s, "median_step_s": med, "samples_per_s": s["batch"] / med, "timed_steps": len(timed)}


# -- hybridrl (its own process) ---------------------------------------------------------------------------------------
def run_hybridrl(work: Path, s: dict) -> dict:
    import torch

    from hybridrl.config import load_config
    from hybridrl.trainer.preference import PreferenceTrainer

    run_dir = work / "hybridrl_run"
    overrides = [
        f"data.train_files={work / 'pairs.jsonl'}",
        f"data.train_batch_size={s['batch']}",
        f"data.max_prompt_length={s['max_prompt_length']}",
        f"data.max_response_length={s['max_response_length']}",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={work / 'model'}",
        "actor_rollout_ref.model.random_init=false",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s['micro']}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={2 * s['micro']}",  # 16 sequences, as TRL's ref pass
        "actor_rollout_ref.actor.grad_clip=1.0",
        f"actor_rollout_ref.actor.optim.lr={s['lr']}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=constant",
        "algorithm.name=dpo",
        "preference.loss_type=sigmoid",
        f"preference.beta={s['beta']}",
        "preference.label_smoothing=0.0",
        "preference.precompute_ref_log_probs=false",
        f"trainer.device={s['device']}",
        f"trainer.total_training_steps={s['steps']}",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.seed={s['seed']}",
        "warmup.steps=0",
    ]
    cfg = load_config(REPO / "configs" / "dpo.yaml", overrides)
    if s["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = PreferenceTrainer(cfg)
    setup_s = time.perf_counter() - t0
    # The loop always writes a checkpoint after the last step (outside timing_s/step); it is not part of what is
    # compared, and ~6 GB of fp32 weights + AdamW state would only cost disk and wall time here.
    trainer.run.save_checkpoint = lambda *a, **k: None
    trainer.fit()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    last = rows[-1]
    return {
        **summarize([r["timing_s/step"] for r in rows], s),
        **memory(s["device"]),
        "setup_s": setup_s,
        "logged_samples_per_s": [r["perf/samples_per_s"] for r in rows],
        "tokens_per_step": [r["perf/total_num_tokens"] for r in rows],
        "loss": last["loss"],
        "rewards/accuracies": last["rewards/accuracies"],
        "rewards/margins": last.get("rewards/margins"),
        "losses": [r["loss"] for r in rows],
        "stage_s": {
            k: statistics.median(r[k] for r in rows[s["warmup"] :] or rows)
            for k in ("timing_s/ref", "timing_s/update_actor")
            if k in last
        },
    }


# -- TRL (its own process) -------------------------------------------------------------------------------------------
def run_trl(work: Path, s: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer
    from trl import __version__ as trl_version

    cuda = s["device"] == "cuda"

    class StepTimer(TrainerCallback):
        """Optimizer-step wall time, synchronized: on_step_begin .. on_step_end (and end-to-end intervals,
        which also cover the batch fetch/collation done before on_step_begin and the logging after)."""

        def __init__(self):
            self.step_s, self.ends, self.t0 = [], [], None

        def _now(self):
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_train_begin(self, args, state, control, **kw):
            self.ends.append(self._now())

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = self._now()

        def on_step_end(self, args, state, control, **kw):
            t = self._now()
            self.step_s.append(t - self.t0)
            self.ends.append(t)

    rows = [json.loads(line) for line in (work / "pairs.jsonl").read_text().splitlines() if line.strip()]
    tok = AutoTokenizer.from_pretrained(work / "model")
    config = DPOConfig(
        output_dir=str(work / "trl_run"),
        per_device_train_batch_size=s["micro"],
        gradient_accumulation_steps=s["batch"] // s["micro"],
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=s["beta"],
        loss_type=["sigmoid"],
        label_smoothing=0.0,
        max_length=s["max_length"],
        precompute_ref_log_probs=False,
        gradient_checkpointing=False,
        bf16=cuda,
        use_cpu=not cuda,
        model_init_kwargs={"dtype": torch.float32},
        max_steps=s["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=s["seed"],
        dataloader_num_workers=0,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    timer = StepTimer()
    trainer = DPOTrainer(
        model=str(work / "model"), args=config, train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[timer]
    )
    setup_s = time.perf_counter() - t0
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "rewards/accuracies" in h]
    last = logs[-1]
    intervals = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    return {
        **summarize(timer.step_s, s),
        **memory(s["device"]),
        "setup_s": setup_s,
        "interval_s": intervals,
        "samples_per_s_end_to_end": s["batch"] / statistics.median(intervals[s["warmup"] :] or intervals),
        "loss": last["loss"],
        "rewards/accuracies": last["rewards/accuracies"],
        "rewards/margins": last.get("rewards/margins"),
        "losses": [h["loss"] for h in logs],
        "trl_version": trl_version,
        "optim": str(config.optim),
    }


# -- driver ----------------------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "dpo_bench_out"))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 96 pairs, 3 steps")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="leading steps left out of the median")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--only", choices=["hybridrl", "trl"], action="append", help="run only this trainer (repeatable)")
    ap.add_argument("--worker", choices=["hybridrl", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    s = settings(args)

    if args.worker:  # child: one trainer, result as JSON on the last stdout line
        work = Path(args.work)
        res = (run_hybridrl if args.worker == "hybridrl" else run_trl)(work, s)
        (work / f"{args.worker}.json").write_text(json.dumps(res, indent=1))
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dpo_bench_"))
    prepare(work, s)
    results: dict = {"settings": {k: v for k, v in s.items()}, "versions": versions()}
    for name in args.only or ["hybridrl", "trl"]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--work", str(work)]
        cmd += ["--tiny"] if args.tiny else []
        cmd += [f"--{k}={v}" for k, v in (("steps", args.steps), ("warmup", args.warmup), ("pairs", args.pairs)) if v is not None]
        results[name] = run_child("dpo-bench", name, cmd, out, work)

    (out / "dpo_bench.json").write_text(json.dumps(results, indent=1))
    print_table(results, s)
    print(f"[dpo-bench] wrote {out / 'dpo_bench.json'}")
    return 0 if all("error" not in results.get(n, {}) for n in args.only or ["hybridrl", "trl"]) else 1


def print_table(results: dict, s: dict) -> None:
    f = cell
    print(
        f"\nDPO, {s['pairs']} pairs, {s['batch']} pairs/step (micro {s['micro']}), {s['steps']} steps, "
        f"median over steps {s['warmup'] + 1}-{s['steps']}, device {s['device']}  {results['versions']}"
    )
    print(
        f"| {'trainer':<9} | {'pairs/s':>8} | {'median step s':>13} | {'peak mem GB':>11} | {'final loss':>10} "
        f"| {'rewards/acc':>11} |"
    )
    print(f"|{'-' * 11}|{'-' * 10}|{'-' * 15}|{'-' * 13}|{'-' * 12}|{'-' * 13}|")
    for name in ("hybridrl", "trl"):
        r = results.get(name)
        if not r or "error" in r:
            print(f"| {name:<9} | {'failed' if r else 'not run':>8} |")
            continue
        print(
            f"| {name:<9} | {f(r['samples_per_s'], '8.2f')} | {f(r['median_step_s'], '13.3f')} "
            f"| {f(r['peak_mem_gb'], '11.2f')} | {f(r['loss'], '10.4f')} | {f(r['rewards/accuracies'], '11.3f')} |"
        )
    h, t = results.get("hybridrl", {}), results.get("trl", {})
    if "samples_per_s" in h and "samples_per_s" in t:
        print(
            f"hybridrl / TRL pairs/s: {h['samples_per_s'] / t['samples_per_s']:.2f}x "
            f"(TRL end-to-end incl. batch fetch + logging: {t['samples_per_s_end_to_end']:.2f} pairs/s)"
        )


if __name__ == "__main__":
    sys.exit(main())
