"""GRPO: hybridrl vs TRL's GRPOTrainer on the same model, data, prompt, reward and settings, on one GPU.

Command (one GPU; the GPU machine lacks trl/datasets/dill/multiprocess/xxhash: carry their wheels):
    PYTHONPATH=. python benchmarks/vs_trl.py --model MODEL_DIR --train gsm8k/train.jsonl --test gsm8k/test.jsonl \
        --budget-s 240 --out $OUT
Where one command would not fit a time limit, run the halves one after the other into the same --out
(`--only hybridrl`, then `--only trl`): a results file with the same settings is added to, not redone.
CPU smoke test (tiny model, arithmetic prompts, 2 cycles each):
    PYTHONPATH=. python benchmarks/vs_trl.py --tiny --out /tmp/vs_trl

What is the same for both (each runs in its own subprocess, so peak memory is its own):
- the model directory (fp32 master weights + bf16 autocast on the GPU for both), the tokenizer;
- the prompts: rendered once with hybridrl's chat-template rendering and handed to TRL as text;
- the reward: hybridrl's built-in scorer of each row's data_source (GSM8K: strict `#### N`; its options,
  e.g. format_score / flexible_score, through --reward-kwargs), called from TRL as a reward function;
- per cycle ("step"): --prompts prompts x --n samples, sampled at temperature 1 up to --max-response
  tokens, then --prompts / --mini-prompts optimizer steps of mini-prompts x n sequences (micro-batches of
  --micro sequences); AdamW, constant lr, weight decay, grad clip 1.0, clip epsilon 0.2, one pass (TRL
  num_iterations=1), token-mean loss (TRL loss_type="dapo"), group-std-normalized advantages
  (TRL scale_rewards="group"), KL coefficient --beta with the k3 estimator (hybridrl low_var_kl);
- a wall-clock training budget (--budget-s, model loading excluded); each stops at the first cycle boundary
  past it. TRL generates with HF `generate` (the GPU image has no vLLM); hybridrl with --rollout.

Reported for each: median seconds per cycle (the first cycle is warm-up and left out), response tokens
per second of cycle time, peak GPU memory, the reward / response-length curves against wall time, and
accuracy on the first --eval-limit test questions before and after training, all evaluated the same
way (hybridrl's engine, greedy, strict and flexible GSM8K extraction). Writes $OUT/vs_trl.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import REPO, cell, run_child, versions  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

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
    tiny = args.tiny
    s = dict(
        prompts=args.prompts or (8 if tiny else 64),
        n=args.n or (4 if tiny else 8),
        mini_prompts=args.mini_prompts or (4 if tiny else 16),
        micro=args.micro or (8 if tiny else 32),
        max_prompt=64 if tiny else 512,
        max_response=args.max_response or (4 if tiny else 256),
        lr=args.lr if args.lr is not None else (1e-3 if tiny else 1e-6),
        weight_decay=0.0,
        beta=args.beta,
        temperature=1.0,
        reward_kwargs=reward_kwargs(args),
        budget_s=args.budget_s or (10.0 if tiny else 240.0),
        max_cycles=args.max_cycles or (2 if tiny else 10**6),
        eval_limit=args.eval_limit or (16 if tiny else 1319),
        eval_max_response=4 if tiny else 512,
        rollout=args.rollout or ("hf" if tiny else "native"),
        seed=1,
        device="cpu" if tiny else "cuda",
        hybridrl_overrides=list(args.set or []),
        profile_update=args.profile_update,
    )
    seqs = s["mini_prompts"] * s["n"]
    if s["prompts"] % s["mini_prompts"] or seqs % s["micro"]:
        raise SystemExit("--prompts must be a multiple of --mini-prompts, and --mini-prompts x --n of --micro")
    s["steps_per_cycle"] = s["prompts"] // s["mini_prompts"]
    s["grad_accum"] = seqs // s["micro"]
    return s


# -- shared inputs ---------------------------------------------------------------------------------------------------
def prepare(work: Path, args, s: dict) -> tuple[Path, Path, Path]:
    """(model dir, train rows, test rows) in verl's row format; the tiny mode builds all three."""
    from hybridrl.data.converters import convert_gsm8k, make_arith, read_rows

    if args.tiny:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from hybridrl.models.tiny import write_tiny_model_dir

        model_dir = write_tiny_model_dir(work / "model", **TINY)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).save_pretrained(model_dir)
        paths = make_arith(work / "arith")
        return model_dir, Path(paths["train"]), Path(paths["test"])
    out = []
    for split, src in (("train", args.train), ("test", args.test)):
        rows = read_rows(src)
        if rows and "question" in rows[0]:  # raw GSM8K (question/answer): convert to verl's rows
            dst = work / f"{split}.jsonl"
            convert_gsm8k(src, dst, split=split)
            out.append(dst)
        else:
            out.append(Path(src))
    return Path(args.model), out[0], out[1]


def trl_rows(model_dir: Path, train: Path, max_prompt: int) -> list[dict]:
    """TRL's dataset: the same prompt text hybridrl renders, with the scorer's inputs as extra columns."""
    from hybridrl.data.dataset import load_prompt_records
    from hybridrl.models.loading import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    # truncation=error: a prompt TRL would see whole while hybridrl cut it would make the runs differ.
    records = load_prompt_records(str(train), tok, max_prompt_length=max_prompt, truncation="error")
    return [{"prompt": r.raw_prompt, "ground_truth": str(r.ground_truth), "data_source": r.data_source} for r in records]


def memory(device: str) -> dict:
    import torch

    if device != "cuda":
        return {"peak_mem_gb": None}
    return {"peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30}


# -- hybridrl (its own process) ---------------------------------------------------------------------------------------
def run_hybridrl(work: Path, s: dict) -> dict:
    import torch

    from hybridrl.config import load_config
    from hybridrl.trainer.ppo import PPOTrainer

    overrides = [
        f"data.train_files={work / 'train.rows.jsonl'}",
        "data.val_files=null",
        f"data.train_batch_size={s['prompts']}",
        f"data.max_prompt_length={s['max_prompt']}",
        f"data.max_response_length={s['max_response']}",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={work / 'model_link'}",
        "actor_rollout_ref.model.random_init=false",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s['mini_prompts']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={s['micro']}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={s['micro']}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={s['micro']}",
        f"actor_rollout_ref.actor.optim.lr={s['lr']}",
        f"actor_rollout_ref.actor.optim.weight_decay={s['weight_decay']}",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.use_kl_loss={str(s['beta'] > 0).lower()}",
        f"actor_rollout_ref.actor.kl_loss_coef={s['beta']}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.rollout.name={s['rollout']}",
        f"actor_rollout_ref.rollout.n={s['n']}",
        f"actor_rollout_ref.rollout.temperature={s['temperature']}",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        f"custom_reward_function.reward_kwargs={_reward_kwargs_yaml(s)}",
        f"trainer.device={s['device']}",
        "trainer.total_training_steps=1000000",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={work / 'hybridrl_run'}",
        "trainer.resume_mode=disable",
        f"trainer.seed={s['seed']}",
        "trainer.val_before_train=false",
        "trainer.log_samples=0",
        "warmup.steps=0",
        *s["hybridrl_overrides"],
    ]
    cfg = load_config(REPO / "configs" / "gsm8k_grpo.yaml", overrides)
    if s["device"] == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = PPOTrainer(cfg)
    run = trainer.run
    setup_s = time.perf_counter() - t0
    cycles: list[dict] = []
    profiles: dict = {}
    update = run.actor.update_actor
    start = time.perf_counter()
    while time.perf_counter() - start < s["budget_s"] and len(cycles) < s["max_cycles"]:
        run.global_step += 1
        first, cycle = s.get("profile_update"), len(cycles) + 1
        profiled = None if first is None or cycle not in (first, first + 1) else "host" if cycle == first else "device"
        run.actor.update_actor = _profiled(update, profiled, profiles) if profiled else update
        t = time.perf_counter()
        m = trainer.step(run.loader.next_batch())  # its metrics are Python floats: the GPU work is done
        now = time.perf_counter()
        cycles.append(
            {
                "profiled": profiled,
                "cycle_s": now - t,
                "t_end_s": now - start,
                "reward": m["critic/score/mean"],
                "response_length": m["response_length/mean"],
                "kl": m.get("actor/kl_loss"),
                "response_tokens": m["response_length/mean"] * s["prompts"] * s["n"],
                "timing_s": {k[len("timing_s/") :]: v for k, v in m.items() if k.startswith("timing_s/")},
            }
        )
        print(
            f"[hybridrl] cycle {len(cycles)}: {cycles[-1]['cycle_s']:.2f}s reward {m['critic/score/mean']:.3f} "
            f"len {m['response_length/mean']:.0f}",
            flush=True,
        )
    mem = memory(s["device"])
    run.actor.save_model(str(work / "hybridrl_model"))
    out = {**summarize(cycles), **mem, "setup_s": setup_s, "model_dir": str(work / "hybridrl_model")}
    return {**out, "update_profiles": profiles} if profiles else out


def _profiled(update, kind: str, profiles: dict):
    """--profile-update N: cycle N's actor update runs under cProfile (kind "host": the host's time
    by function), cycle N + 1's under torch.profiler ("device": kernel time, GPU busy); the result
    goes to profiles[kind]."""
    import torch

    if str(Path(__file__).resolve().parent) not in sys.path:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
    from profile_passes import host_profile, profile

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def wrapped(batch):
        box = {}

        def call():
            box["out"] = update(batch)

        profiles[kind] = (host_profile if kind == "host" else profile)(call, device)
        return box["out"]

    return wrapped


def reward_kwargs(args) -> dict:
    """--reward-kwargs (a JSON object of the scorer's options) with --format-score folded in."""
    try:
        kw = json.loads(args.reward_kwargs or "{}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"--reward-kwargs must be a JSON object, e.g. '{{\"format_score\": 0.1}}': {e}") from None
    if not isinstance(kw, dict):
        raise SystemExit(f"--reward-kwargs must be a JSON object, got {args.reward_kwargs!r}")
    if args.format_score:
        kw["format_score"] = args.format_score
    return kw


def _reward_kwargs_yaml(s: dict) -> str:
    return json.dumps(s["reward_kwargs"])  # JSON is YAML: the override parser reads it as a mapping


# -- TRL (its own process) -------------------------------------------------------------------------------------------
def run_trl(work: Path, s: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl import __version__ as trl_version

    from hybridrl.rewards import default_compute_score

    cuda = s["device"] == "cuda"
    kwargs = s["reward_kwargs"]

    def reward(prompts, completions, ground_truth, data_source, **_):
        return [float(default_compute_score(d, c, g, **kwargs)) for c, g, d in zip(completions, ground_truth, data_source)]

    class CycleClock(TrainerCallback):
        """Wall time of each cycle (one generation + steps_per_cycle optimizer steps); stops at a cycle
        boundary once the budget is spent."""

        def __init__(self):
            self.start = self.last = None
            self.cycle_s, self.t_end = [], []

        def _now(self):
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_train_begin(self, args, state, control, **kw):
            self.start = self.last = self._now()

        def on_step_end(self, args, state, control, **kw):
            if state.global_step % s["steps_per_cycle"]:
                return
            now = self._now()
            self.cycle_s.append(now - self.last)
            self.t_end.append(now - self.start)
            self.last = now
            print(f"[trl] cycle {len(self.cycle_s)}: {self.cycle_s[-1]:.2f}s", flush=True)
            if now - self.start >= s["budget_s"] or len(self.cycle_s) >= s["max_cycles"]:
                control.should_training_stop = True

    rows = [json.loads(line) for line in (work / "trl_rows.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(work / "model_link")
    config = GRPOConfig(
        output_dir=str(work / "trl_run"),
        per_device_train_batch_size=s["micro"],
        gradient_accumulation_steps=s["grad_accum"],
        num_generations=s["n"],
        steps_per_generation=s["steps_per_cycle"],
        num_iterations=1,
        max_completion_length=s["max_response"],
        temperature=s["temperature"],
        top_p=1.0,
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=s["weight_decay"],
        max_grad_norm=1.0,
        epsilon=0.2,
        beta=s["beta"],
        loss_type="dapo",
        scale_rewards="group",
        use_vllm=False,
        bf16=cuda,
        use_cpu=not cuda,
        gradient_checkpointing=False,
        model_init_kwargs={"dtype": torch.float32},
        max_steps=s["steps_per_cycle"] * min(s["max_cycles"], 100000),
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=s["seed"],
        dataloader_num_workers=0,
        log_completions=False,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    clock = CycleClock()
    trainer = GRPOTrainer(
        model=str(work / "model_link"),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
        callbacks=[clock],
    )
    setup_s = time.perf_counter() - t0
    trainer.train()
    mem = memory(s["device"])
    logs = [h for h in trainer.state.log_history if "reward" in h]
    # TRL logs every optimizer step; the rollout metrics repeat within a cycle: take each cycle's first.
    per_cycle = logs[:: s["steps_per_cycle"]]
    cycles = []
    for i, (dt, t_end) in enumerate(zip(clock.cycle_s, clock.t_end)):
        h = per_cycle[i] if i < len(per_cycle) else {}
        length = h.get("completions/mean_length")
        cycles.append(
            {
                "cycle_s": dt,
                "t_end_s": t_end,
                "reward": h.get("reward"),
                "response_length": length,
                "kl": h.get("kl"),
                "response_tokens": None if length is None else length * s["prompts"] * s["n"],
            }
        )
    trainer.save_model(str(work / "trl_model"))
    tok.save_pretrained(work / "trl_model")
    return {**summarize(cycles), **mem, "setup_s": setup_s, "model_dir": str(work / "trl_model"), "trl_version": trl_version}


def summarize(cycles: list[dict]) -> dict:
    # the first cycle carries one-time costs (CUDA graphs, allocator, kernels); profiled ones run slower
    timed = [c for c in cycles[1:] if not c.get("profiled")] or cycles
    med = statistics.median(c["cycle_s"] for c in timed) if timed else None
    toks = [c["response_tokens"] / c["cycle_s"] for c in timed if c.get("response_tokens")]
    return {
        "cycles": cycles,
        "n_cycles": len(cycles),
        "median_cycle_s": med,
        "response_tokens_per_s": statistics.median(toks) if toks else None,
    }


# -- evaluation (its own process) -------------------------------------------------------------------------------------
def run_eval(work: Path, s: dict, model_dir: str, tag: str) -> dict:
    out = work / f"eval_{tag}"
    cmd = [
        sys.executable,
        "-m",
        "hybridrl",
        "eval",
        "--model",
        model_dir,
        "--data",
        str(work / "test.rows.jsonl"),
        "--limit",
        str(s["eval_limit"]),
        "--max-response-length",
        str(s["eval_max_response"]),
        "--batch-size",
        "1024" if s["device"] == "cuda" else "16",
        "--device",
        s["device"],
        "--output",
        f"{out}.jsonl",
        "--summary",
        f"{out}.json",
        "--rollout",
        s["rollout"],
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=REPO)
    summary = json.loads(Path(f"{out}.json").read_text())
    return {"eval_s": time.perf_counter() - t0, **next(iter(summary.values()))}


# -- driver ----------------------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "vs_trl_out"))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, arithmetic prompts")
    ap.add_argument("--model", help="local HF model directory")
    ap.add_argument("--train", help="training prompts: verl rows or raw GSM8K question/answer JSONL")
    ap.add_argument("--test", help="test prompts, same formats")
    ap.add_argument("--budget-s", type=float, help="training wall-clock budget per framework (default 240)")
    ap.add_argument("--max-cycles", type=int, help="stop after this many cycles even within the budget")
    ap.add_argument("--prompts", type=int, help="prompts per cycle (default 64)")
    ap.add_argument("--n", type=int, help="samples per prompt (default 8)")
    ap.add_argument("--mini-prompts", type=int, help="prompts per optimizer step (default 16)")
    ap.add_argument("--micro", type=int, help="sequences per forward/backward (default 32)")
    ap.add_argument("--max-response", type=int, help="response tokens (default 256)")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--beta", type=float, default=0.001, help="KL coefficient (0 = no reference model)")
    ap.add_argument("--format-score", type=float, default=0.0, help="reward of a well-formed wrong GSM8K answer")
    ap.add_argument(
        "--reward-kwargs",
        help="JSON object of scorer options for both trainers, e.g. "
        '\'{"format_score": 0.1, "format_needs_work": true, "flexible_score": 0.2}\'',
    )
    ap.add_argument("--eval-limit", type=int, help="first N test questions (default all 1319)")
    ap.add_argument("--rollout", choices=["native", "hf"], help="hybridrl's engine (default native on GPU)")
    ap.add_argument("--only", choices=["hybridrl", "trl"], action="append")
    ap.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="a hybridrl config override (repeatable), e.g. actor_rollout_ref.actor.use_cuda_graph=true",
    )
    ap.add_argument(
        "--profile-update",
        type=int,
        metavar="N",
        help="hybridrl: cycle N's actor update under cProfile and cycle N+1's under torch.profiler "
        "(in vs_trl.json; both cycles left out of the median)",
    )
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--worker", choices=["hybridrl", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    s = settings(args)

    if args.worker:  # child: one trainer, result as JSON in the work dir
        work = Path(args.work)
        res = (run_hybridrl if args.worker == "hybridrl" else run_trl)(work, s)
        (work / f"{args.worker}.json").write_text(json.dumps(res, indent=1))
        return 0
    if not args.tiny and not (args.model and args.train and args.test):
        ap.error("--model, --train and --test are required (or --tiny)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    model_dir, train, test = prepare(work, args, s)
    from hybridrl.data.converters import read_rows, write_rows

    write_rows(read_rows(train), work / "train.rows.jsonl")
    write_rows(read_rows(test), work / "test.rows.jsonl")
    (work / "model_link").symlink_to(Path(model_dir).resolve())
    with (work / "trl_rows.jsonl").open("w") as f:
        for r in trl_rows(work / "model_link", work / "train.rows.jsonl", s["max_prompt"]):
            f.write(json.dumps(r) + "\n")

    results: dict = {"settings": s, "versions": versions()}
    prev = out / "vs_trl.json"
    if args.only and prev.exists():  # a comparison split over several commands (--only hybridrl, then --only trl)
        old = json.loads(prev.read_text())
        if old.get("settings") == s:
            results = {**old, **results}
            print(f"[vs-trl] adding to {prev} (has: {', '.join(k for k in ('base_eval', 'hybridrl', 'trl') if k in old)})")
        else:
            print(f"[vs-trl] {prev} was written with other settings: starting a new comparison", flush=True)
    if not args.skip_eval and "base_eval" not in results:
        results["base_eval"] = run_eval(work, s, str(work / "model_link"), "base")
        print(f"[vs-trl] base model: {results['base_eval']}", flush=True)
    for name in args.only or ["hybridrl", "trl"]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--work", str(work), *sys.argv[1:]]
        results[name] = run_child("vs-trl", name, cmd, out, work)
        if "error" not in results[name] and not args.skip_eval:
            results[name]["eval"] = run_eval(work, s, results[name]["model_dir"], name)
        (out / "vs_trl.json").write_text(json.dumps(results, indent=1))
    (out / "vs_trl.json").write_text(json.dumps(results, indent=1))
    print_table(results, s)
    print(f"[vs-trl] wrote {out / 'vs_trl.json'}")
    return 0 if all("error" not in results.get(n, {}) for n in args.only or ["hybridrl", "trl"]) else 1


def print_table(results: dict, s: dict) -> None:
    f = cell
    print(
        f"\nGRPO cycles of {s['prompts']} prompts x {s['n']} samples x <= {s['max_response']} tokens, "
        f"{s['steps_per_cycle']} optimizer steps each; budget {s['budget_s']:.0f} s; {results['versions']}"
    )
    base = results.get("base_eval", {})
    print(
        f"base model: strict {f(base.get('accuracy'), '.3f')}, flexible {f(base.get('flexible_accuracy'), '.3f')} "
        f"on {base.get('n', '-')} test questions"
    )
    print(
        f"| {'trainer':<9} | {'cycles':>6} | {'median s/cycle':>14} | {'resp tok/s':>10} | {'peak GB':>7} "
        f"| {'last reward':>11} | {'strict after':>12} | {'flexible after':>14} |"
    )
    print(f"|{'-' * 11}|{'-' * 8}|{'-' * 16}|{'-' * 12}|{'-' * 9}|{'-' * 13}|{'-' * 14}|{'-' * 16}|")
    for name in ("hybridrl", "trl"):
        r = results.get(name)
        if not r or "error" in r:
            print(f"| {name:<9} | {'failed' if r else 'not run':>6} |")
            continue
        e = r.get("eval", {})
        last = r["cycles"][-1]["reward"] if r["cycles"] else None
        print(
            f"| {name:<9} | {r['n_cycles']:>6} | {f(r['median_cycle_s'], '14.2f')} | {f(r['response_tokens_per_s'], '10.0f')} "
            f"| {f(r['peak_mem_gb'], '7.1f')} | {f(last, '11.3f')} | {f(e.get('accuracy'), '12.3f')} "
            f"| {f(e.get('flexible_accuracy'), '14.3f')} |"
        )
    h, t = results.get("hybridrl", {}), results.get("trl", {})
    if h.get("median_cycle_s") and t.get("median_cycle_s"):
        print(
            f"hybridrl cycle time / TRL's: {h['median_cycle_s'] / t['median_cycle_s']:.3f} "
            f"({t['median_cycle_s'] / h['median_cycle_s']:.1f}x faster)"
        )


if __name__ == "__main__":
    sys.exit(main())
