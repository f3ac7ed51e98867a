"""Step time and idle shares of trainer.mode sync vs one_step_off vs async, one child run each.

Each mode trains the same config for the same steps (default: configs/gsm8k_grpo.yaml on every GPU of
the node; `--smoke`: the quickstart on CPU for a few steps, as tests/e2e/test_async_benchmark.py
runs it). Per mode: the median step time (after `--skip` warm steps), the share of the step the
trainer waited for generation (async/idle_s/trainer), the share of the rollout engine's time it waited
between generations (async/idle_s/rollout against timing_s/gen; sync: the step outside generation),
the mean and max staleness and the last steps' mean score. A table on stdout and $OUT/async.json (or --out).

    python benchmarks/async.py --gpus 8 --steps 20                 # several GPUs (the multi-GPU issue runs it)
    python benchmarks/async.py --gpus 2 --pool 1                   # + one_step_off/async with a rollout pool
    python benchmarks/async.py --smoke                             # CPU, seconds

`--pool N` adds the off-policy modes with a rollout pool of their own (resource_pool.rollout=N, the
actor on the other gpus - N; `--pool auto`: resource_pool.rollout=auto, the split chosen after its
calibration steps, which `--skip` should pass, and reported as rollout_auto in async.json): there the
pool generates while the actor trains, and its idle share is its own (async/idle_s/rollout against
rollout_pool/generate_s); and one_step_off/pool/partial, with
async_training.partial_rollout (the share of tokens sampled by newer weights is in its metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, child_env, versions  # noqa: E402

MODES = ("sync", "one_step_off", "async")


def overrides(args, variant: str, run: Path) -> list[str]:
    mode, *extra = variant.split("/")
    pool, partial = "pool" in extra, "partial" in extra
    common = [
        f"trainer.mode={mode}",
        f"async_training.max_staleness={args.max_staleness}",
        f"trainer.default_local_dir={run}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.logger=[jsonl]",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.overwrite=true",
    ]
    if pool and args.pool == "auto":  # chosen after calibration steps (docs/async.md); --skip should pass them
        common += ["resource_pool.rollout=auto"]
    elif pool:
        common += [f"resource_pool.actor_rollout_ref={args.gpus - args.pool}", f"resource_pool.rollout={args.pool}"]
    if partial:
        common += ["async_training.partial_rollout=true"]
    if args.smoke:
        cpu = ["trainer.device=cpu", f"trainer.n_gpus_per_node={args.gpus}", "warmup.steps=5", "data.val_files=null"]
        return [*common, *cpu, *args.set]
    return [*common, "trainer.device=cuda", f"trainer.n_gpus_per_node={args.gpus}", *args.set]


def step_summary(rows: list[dict], skip: int) -> dict:
    rows = [r for r in rows if r.get("step", 0) > 0]
    timed = rows[skip:] or rows
    step = [r["timing_s/step"] for r in timed]
    # the engine's busy time: its own generate time on a rollout pool, else the step's generation
    busy = [r.get("rollout_pool/generate_s", r.get("timing_s/gen", 0.0)) for r in timed]
    if "async/idle_s/trainer" in timed[0]:
        idle_trainer = [r["async/idle_s/trainer"] for r in timed]
        idle_rollout = [r["async/idle_s/rollout"] for r in timed]
    else:  # sync: the trainer waits for all of generation, the engine for all of the rest
        idle_trainer = [r.get("timing_s/gen", 0.0) for r in timed]
        idle_rollout = [r["timing_s/step"] - r.get("timing_s/gen", 0.0) for r in timed]
    scores = [r["critic/score/mean"] for r in rows]
    k = max(1, len(scores) // 4)
    return {
        "steps": len(rows),
        "step_s_median": statistics.median(step),
        "idle_share_trainer": sum(idle_trainer) / sum(step),
        # the engine's own time line: idle between generations, busy generating (timing_s/gen)
        "idle_share_rollout": sum(idle_rollout) / max(sum(idle_rollout) + sum(busy), 1e-9),
        "staleness_mean": statistics.fmean(r.get("async/staleness_mean", 0.0) for r in rows),
        "staleness_max": max(r.get("async/staleness_max", 0.0) for r in rows),
        "score_last": sum(scores[-k:]) / k,
        "partial_token_share": statistics.fmean(r.get("rollout_pool/partial_token_share", 0.0) for r in timed),
        "rollout_auto": next((r["resource_pool/rollout_auto"] for r in rows if "resource_pool/rollout_auto" in r), None),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="default: configs/gsm8k_grpo.yaml (--smoke: configs/quickstart.yaml)")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="default 20 (--smoke: 4)")
    p.add_argument("--skip", type=int, default=None, help="warm steps left out of the step time; default 3 (--smoke: 1)")
    p.add_argument("--max-staleness", type=int, default=2, help="async_training.max_staleness of the async run")
    p.add_argument("--set", nargs="*", default=[], help="further key=value overrides for every run")
    p.add_argument("--smoke", action="store_true", help="CPU, the quickstart, a few steps")
    p.add_argument(
        "--pool",
        type=lambda v: v if v == "auto" else int(v),
        default=0,
        help="also one_step_off and async with resource_pool.rollout=N (or auto: the rollout devices chosen after calibration)",
    )
    p.add_argument("--modes", nargs="*", default=None, help="only these variants (e.g. sync one_step_off/pool)")
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/async"))
    args = p.parse_args()
    args.config = args.config or ("configs/quickstart.yaml" if args.smoke else "configs/gsm8k_grpo.yaml")
    args.steps = args.steps or (4 if args.smoke else 20)
    args.skip = args.skip if args.skip is not None else (1 if args.smoke else 3)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = {"versions": versions(), "config": args.config, "gpus": args.gpus, "steps": args.steps, "modes": {}}
    variants = list(MODES) + (["one_step_off/pool", "async/pool", "one_step_off/pool/partial"] if args.pool else [])
    for mode in args.modes or variants:
        run = out / mode.replace("/", "_")
        cmd = [sys.executable, "-m", "hybridrl", "train", args.config, *overrides(args, mode, run)]
        print(f"[async] {mode}: {' '.join(cmd[3:])}", flush=True)
        t0 = time.perf_counter()
        log_path = out / f"{run.name}.log"
        with log_path.open("w") as log:
            rc = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            print("\n".join(log_path.read_text().splitlines()[-30:]))
            raise SystemExit(f"[async] {mode} failed (rc={rc}), log in {log_path}")
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        result["modes"][mode] = {**step_summary(rows, args.skip), "wall_s": time.perf_counter() - t0}
    first = "sync" if "sync" in result["modes"] else next(iter(result["modes"]))
    base = result["modes"][first]["step_s_median"]
    print(f"\n{'mode':<26}{'step s':>9}{'speed-up':>10}{'trainer idle':>14}{'rollout idle':>14}{'staleness':>11}{'score':>8}")
    for mode, m in result["modes"].items():
        m["speedup_vs_sync"] = base / m["step_s_median"]
        print(
            f"{mode:<26}{m['step_s_median']:>9.3f}{m['speedup_vs_sync']:>9.2f}x{100 * m['idle_share_trainer']:>13.1f}%"
            f"{100 * m['idle_share_rollout']:>13.1f}%{m['staleness_mean']:>6.2f}/{m['staleness_max']:<4.0f}"
            f"{m['score_last']:>8.3f}"
        )
    (out / "async.json").write_text(json.dumps(result, indent=2))
    print(f"[async] wrote {out / 'async.json'}")


if __name__ == "__main__":
    main()
