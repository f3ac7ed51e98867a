"""Multi-turn rollout throughput: what pausing for tools costs the native engine, one run.

Command (one GPU):  PYTHONPATH=. python benchmarks/multiturn.py --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/multiturn.py --tiny --out /tmp/multiturn_bench

A random-weight model of a real architecture (Qwen2.5-0.5B by default; speed depends on shapes,
not weights) and a scripted environment instead of a parser and tools, so every trajectory has
the same shape: `--turns` model turns of exactly `--turn-tokens` tokens each (the turn budget
ends them; EOS is ignored), each but the last answered by `--env-tokens` appended tokens after a
delay (exponentially distributed with mean `--delay-ms`, seeded). Rows, same prompts, same
engine, one process:
- single-turn: the same model tokens (`turns x turn_tokens`) in one turn: the ceiling;
- multi-turn with `resume_wait_steps` 0 (a row rejoins as soon as its answer arrives) and with
  each value of `--waits` (answered rows wait up to that many decode steps to rejoin together).
Each row: model tokens/s (tokens the model sampled / wall time of the generate call, after a
warm-up call), the engine's decode ms/step, extend passes and their rows and seconds, and the
share of wall time in which every sequence waited on the environment. Median of `--repeats`.
Prints a table and writes multiturn_bench.json to --out.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rollout import MODELS, _Tok, hf_model, make_prompts, sync  # noqa: E402

from hybridrl.data import keys as K  # noqa: E402
from hybridrl.rollout import SamplingParams  # noqa: E402
from hybridrl.rollout.base import Hooks  # noqa: E402
from hybridrl.rollout.native.engine import NativeRolloutEngine  # noqa: E402


class ScriptedEnvironment:
    """The engine's side of the agent protocol (`AgentSession`'s begin / turn_limit / end_turn /
    poll / finish / metrics) with fixed shapes: each turn ends at `turn_tokens`; after it, unless
    it was the last, `env_tokens` random tokens come back after a random delay (a timer thread,
    as a tool's answer would come from the event loop)."""

    def __init__(self, turns: int, turn_tokens: int, env_tokens: int, delay_ms: float, vocab: int, seed: int = 0):
        self.turns, self.turn_tokens, self.env_tokens, self.delay_ms, self.vocab = turns, turn_tokens, env_tokens, delay_ms, vocab
        self.rng = np.random.default_rng(seed)

    def begin(self, prompts, n: int, max_total: int) -> None:
        self.max_total = max_total
        total = len(prompts) * n
        self.done_turns = [0] * total
        self.results: queue.Queue = queue.Queue()
        self.in_flight = 0
        self.lock = threading.Lock()
        self.timers: list[threading.Timer] = []

    def turn_limit(self, row: int, length: int) -> int:
        return min(self.max_total, length + self.turn_tokens)

    def end_turn(self, row: int, tokens: list[int], ended_on_eos: bool) -> None:
        self.done_turns[row] += 1
        if self.done_turns[row] >= self.turns:
            self.results.put((row, None))
            return
        answer = self.rng.integers(2, self.vocab, self.env_tokens).tolist()
        delay = self.rng.exponential(self.delay_ms / 1000) if self.delay_ms > 0 else 0.0
        with self.lock:
            self.in_flight += 1
        if delay == 0:
            self.results.put((row, answer))
            return
        timer = threading.Timer(delay, self.results.put, args=((row, answer),))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def poll(self, block: bool) -> list:
        out = []
        while True:
            with self.lock:
                waiting = self.in_flight
            try:
                row, item = self.results.get(block=block and not out and waiting > 0)
            except queue.Empty:
                return out
            if item is not None:
                with self.lock:
                    self.in_flight -= 1
            out.append((row, item))

    def finish(self, batch):
        return batch

    def metrics(self, elapsed_s: float, tool_wait_s: float) -> dict:
        return {"agent/tool_wait_share": tool_wait_s / max(elapsed_s, 1e-9)}


def timed(engine, prompts, sampling, env=None) -> dict:
    sync()
    t = time.perf_counter()
    out = engine.generate(prompts, sampling, Hooks(agent=env), seeds=list(range(len(prompts))))
    sync()
    wall = time.perf_counter() - t
    m = engine.last_metrics
    return dict(
        wall_s=wall,
        model_tokens=int(out[K.RESPONSE_MASK].sum()),
        tokens_per_s=float(out[K.RESPONSE_MASK].sum()) / wall,
        decode_ms=m["rollout/decode_ms_per_step"],
        decode_steps=m["rollout/decode_steps"],
        extend_passes=m.get("rollout/extend_passes", 0.0),
        extend_rows_mean=m.get("rollout/extend_rows_mean", 0.0),
        extend_s=m.get("rollout/extend_s", 0.0),
        wait_share=m.get("agent/tool_wait_share", 0.0),
    )


def median_row(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny config")
    ap.add_argument("--out", default=".")
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=None)
    ap.add_argument("--env-tokens", type=int, default=None)
    ap.add_argument("--delays-ms", nargs="*", type=float, default=[0.0, 100.0])
    ap.add_argument("--waits", nargs="*", type=int, default=[16])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    device = torch.device("cpu" if args.tiny else "cuda")
    name = args.model or ("tiny" if args.tiny else "Qwen2.5-0.5B")
    prompts_n = args.prompts or (8 if args.tiny else 256)
    prompt_len = args.prompt_len or (16 if args.tiny else 256)
    turn_tokens = args.turn_tokens or (8 if args.tiny else 128)
    env_tokens = args.env_tokens or (4 if args.tiny else 64)
    model_tokens = args.turns * turn_tokens
    total = model_tokens + (args.turns - 1) * env_tokens
    cfg = MODELS[name]
    trainer = hf_model(name, device)
    engine = NativeRolloutEngine(
        trainer.config,
        _Tok(cfg["eos_token_id"], cfg["pad_token_id"]),
        device=device,
        max_model_len=prompt_len + total,
        max_num_seqs=prompts_n,
        ignore_eos=True,
    )
    engine.load_weights(trainer.named_parameters())
    del trainer
    prompts = make_prompts(prompts_n, prompt_len, cfg["vocab_size"])
    results = dict(
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        torch=torch.__version__,
        model=name,
        prompts=prompts_n,
        prompt_len=prompt_len,
        turns=args.turns,
        turn_tokens=turn_tokens,
        env_tokens=env_tokens,
        repeats=args.repeats,
        rows=[],
    )
    print(f"device {results['device']}: {name}, {prompts_n} prompts x {prompt_len} tokens", flush=True)

    def measure(label: str, sampling, make_env=None, wait: int | None = None, delay: float = 0.0):
        if wait is not None:
            engine.resume_wait_steps = wait
        timed(engine, prompts, sampling, make_env() if make_env else None)  # warm-up (graphs, allocator)
        runs = [timed(engine, prompts, sampling, make_env() if make_env else None) for _ in range(args.repeats)]
        row = dict(label=label, delay_ms=delay, wait=wait, **median_row(runs))
        assert row["model_tokens"] == prompts_n * model_tokens, (row["model_tokens"], prompts_n * model_tokens)
        results["rows"].append(row)
        print(f"{label}: {row}", flush=True)

    single = SamplingParams(n=1, temperature=1.0, max_new_tokens=model_tokens)
    measure("single-turn", single)
    multi = SamplingParams(n=1, temperature=1.0, max_new_tokens=total)
    for delay in args.delays_ms:
        for wait in [0, *args.waits]:

            def env(delay=delay):
                return ScriptedEnvironment(args.turns, turn_tokens, env_tokens, delay, cfg["vocab_size"])

            measure(f"{args.turns} turns, delay {delay:g} ms, wait {wait}", multi, env, wait, delay)
    base = results["rows"][0]["tokens_per_s"]
    print(
        f"\n{name}, {prompts_n} prompts, {args.turns} turns x {turn_tokens} model tokens, {env_tokens} environment tokens "
        f"between turns ({results['device']}, median of {args.repeats})\n"
    )
    header = "rollout | model tok/s | vs single-turn | wall s | decode ms/step | decode steps | extend passes | rows/pass"
    print(f"| {header} | extend s | all waiting |")
    print("| --- " * 10 + "|")
    for r in results["rows"]:
        cells = [
            r["label"],
            f"{r['tokens_per_s']:.0f}",
            f"{r['tokens_per_s'] / base:.2f}",
            f"{r['wall_s']:.2f}",
            f"{r['decode_ms']:.2f}",
            f"{r['decode_steps']:.0f}",
            f"{r['extend_passes']:.0f}",
            f"{r['extend_rows_mean']:.1f}",
            f"{r['extend_s']:.2f}",
            f"{r['wait_share']:.0%}",
        ]
        print("| " + " | ".join(cells) + " |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "multiturn_bench.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
