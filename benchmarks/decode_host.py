"""Where a decode step's wall time goes: the device's kernels or the host.

Command (one GPU):  PYTHONPATH=. python benchmarks/decode_host.py --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/decode_host.py --tiny --out /tmp/decode_host

For each layout of prompts (`aligned`: every prompt 256 tokens, so rows open KV blocks on the same
steps; `ragged`: 100-250 tokens like GSM8K's, so some row opens a block on most steps) and each
number of decode steps per launch, the native engine generates `--new-tokens` tokens for
`--prompts` prompts (random weights of a real architecture, EOS ignored) and reports per decode
step:
- wall ms: the engine's own `rollout/decode_ms_per_step`;
- device ms and busy: kernel time per decode step and its share of the wall time, from two
  profiled generates of different lengths (their difference is decode steps only: no prefill, no
  warm-up), so prefill's dense kernels do not inflate the share;
- host ms in the loop: launching (block tables, row moves, the graph replay) and reading the
  tokens (bookkeeping), and the time the host waits for the device's event;
- syncs: operations that made the host wait for the device inside one generate
  (`torch.cuda.set_sync_debug_mode`), by source line.
If the host's work per step approaches the device's, the device idles between steps.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rollout import MODELS, _Tok, hf_model, switch_time  # noqa: E402

from hybridrl.data import keys as K  # noqa: E402
from hybridrl.data.batch import Batch  # noqa: E402
from hybridrl.rollout import SamplingParams  # noqa: E402
from hybridrl.rollout.native.engine import Generation, NativeRolloutEngine  # noqa: E402


def prompts_for(layout: str, n: int, vocab: int, length: int) -> Batch:
    g = torch.Generator().manual_seed(n)
    lens = [length] * n if layout == "aligned" else torch.randint(100, 251, (n,), generator=g).tolist()
    width = max(lens)
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, m in enumerate(lens):  # left-padded
        ids[i, width - m :] = torch.randint(2, vocab, (m,), generator=g)
        mask[i, width - m :] = 1
    return Batch({K.PROMPTS: ids, K.PROMPT_MASK: mask}, {K.UID: [str(i) for i in range(n)]})


class _Timed:
    """Wraps the engine's launch (`Generation.run`), the runner's decode, the read of a step
    (`Generation._collect`) and the device event: host seconds by part."""

    def __init__(self, engine):
        self.engine, self.t, self.stamps = engine, collections.Counter(), []
        self.launch, self.decode, self.collect = Generation.run, engine.runner.decode, Generation._collect
        timer = self

        class Event:
            def __init__(self, event):
                self.event = event

            def synchronize(self):
                t = time.perf_counter()
                if self.event is not None:
                    self.event.synchronize()
                timer.t["wait"] += time.perf_counter() - t

        def decode(B, mode):
            t = time.perf_counter()
            host, event = self.decode(B, mode)
            self.t["decode_call"] += time.perf_counter() - t
            return host, Event(event)

        def launch(run):
            t = time.perf_counter()
            self.stamps.append(t)
            out = self.launch(run)
            self.t["launch"] += time.perf_counter() - t
            return out

        def collect(*a):
            t = time.perf_counter()
            self.collect(*a)
            self.t["collect"] += time.perf_counter() - t

        Generation.run, engine.runner.decode, Generation._collect = launch, decode, collect

    def restore(self):
        Generation.run, self.engine.runner.decode, Generation._collect = self.launch, self.decode, self.collect


def device_ms(engine, prompts, tokens: int) -> tuple[float, float]:
    """(device ms, wall ms) of one generate of `tokens` tokens under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=tokens)
    engine.generate(prompts, s)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        engine.generate(prompts, s)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
    return sum(e.self_device_time_total for e in prof.key_averages()) / 1000, 1000 * wall


def sync_sites(engine, prompts, tokens: int) -> dict[str, int]:
    """Operations that waited for the device during one generate, by the engine's source line."""
    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=tokens)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.generate(prompts, s)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return dict(sites.most_common())


def measure(engine, prompts, new_tokens: int, cuda: bool) -> dict:
    s = SamplingParams(n=1, temperature=1.0, max_new_tokens=new_tokens)
    engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=8))  # capture graphs
    walls, parts = [], []
    for _ in range(3):
        timed = _Timed(engine)
        if cuda:
            torch.cuda.synchronize()
        engine.generate(prompts, s)
        timed.restore()
        steps = engine.last_metrics["rollout/decode_steps"]
        walls.append(engine.last_metrics["rollout/decode_ms_per_step"])
        t = timed.t
        parts.append(
            dict(
                launch_host_ms=1000 * (t["launch"] - t["decode_call"]) / steps,
                replay_call_ms=1000 * t["decode_call"] / steps,
                wait_ms=1000 * t["wait"] / steps,
                collect_host_ms=1000 * (t["collect"] - t["wait"]) / steps,
                # ms per launch over the first and the last half of the launches (context grows)
                halves_ms=[1000 * float(np.median(np.diff(h))) for h in np.array_split(np.array(timed.stamps), 2)],
            )
        )
    i = int(np.argsort(walls)[1])  # the median run, whole
    row = dict(wall_ms=walls[i], **parts[i])
    if cuda:
        short, long_ = max(8, new_tokens // 4), new_tokens
        d0, w0 = device_ms(engine, prompts, short)
        d1, w1 = device_ms(engine, prompts, long_)
        row["device_ms"] = (d1 - d0) / (long_ - short)
        row["busy"] = row["device_ms"] / row["wall_ms"]
        row["syncs"] = sync_sites(engine, prompts, 32)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test with a tiny config")
    ap.add_argument("--out", default=".")
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--layouts", nargs="*", default=["aligned", "ragged"])
    ap.add_argument("--steps", nargs="*", type=int, default=[1, 2])
    ap.add_argument("--switch", action="store_true", help="first put the engine to sleep and wake it 5 times, loading weights")
    ap.add_argument("--max-batched-tokens", type=int, default=8192, help="the engine's prefill token budget")
    args = ap.parse_args()
    cuda = not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    name = args.model or ("tiny" if args.tiny else "Qwen2.5-0.5B")
    n = args.prompts or (8 if args.tiny else 256)
    new_tokens = args.new_tokens or (16 if args.tiny else 256)
    cfg = MODELS[name]
    trainer = hf_model(name, device)
    rows = []
    tag = "_after_switch" if args.switch else ""
    for steps in args.steps:
        engine = NativeRolloutEngine(
            trainer.config,
            _Tok(cfg["eos_token_id"], cfg["pad_token_id"]),
            device=device,
            max_model_len=256 + new_tokens,
            max_num_batched_tokens=args.max_batched_tokens,
            max_num_seqs=n,
            gpu_memory_utilization=0.3,
            ignore_eos=True,
            decode_steps_per_sync=steps,
        )
        engine.load_weights(trainer.named_parameters())
        if args.switch:  # as in an RL step, and in benchmarks/rollout.py before its rows
            print(f"switch {1000 * switch_time(engine, trainer):.1f} ms", flush=True)
        for layout in args.layouts:
            prompts = prompts_for(layout, n, cfg["vocab_size"], 16 if args.tiny else 256)
            row = dict(model=name, prompts=n, layout=layout + tag, steps=steps, **measure(engine, prompts, new_tokens, cuda))
            print(json.dumps(row), flush=True)
            rows.append(row)
        del engine
        if cuda:
            torch.cuda.empty_cache()
    print(
        "\n| layout | steps/launch | wall ms/step | device ms/step | busy | launch host ms | replay call ms | wait ms "
        "| collect host ms | median ms per launch, first / second half |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    nan = float("nan")
    for r in rows:
        print(
            f"| {r['layout']} | {r['steps']} | {r['wall_ms']:.3f} | {r.get('device_ms', nan):.3f} | {r.get('busy', nan):.0%} "
            f"| {r['launch_host_ms']:.3f} | {r['replay_call_ms']:.3f} | {r['wait_ms']:.3f} | {r['collect_host_ms']:.3f} "
            f"| {r['halves_ms'][0]:.2f} / {r['halves_ms'][1]:.2f} |"
        )
    for r in rows:
        if r.get("syncs"):
            print(f"syncs in one 32-token generate, {r['layout']}, {r['steps']} steps/launch: {r['syncs']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = dict(device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__, new_tokens=new_tokens)
    (out / "decode_host.json").write_text(json.dumps({**info, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
