"""Run-to-run determinism of the quickstart on one GPU, with and without trainer.deterministic.

Four runs of configs/quickstart.yaml on `--device` (default cuda), the same seed: two with
trainer.deterministic=true and two without. For each pair it compares metrics.jsonl step by step
(wall-clock metrics left out): the first step and metric where the runs differ, how many metrics
differ, the largest difference of the score and of the held-out accuracy, and the wall time of each
run (the cost of the deterministic kernels). A table on stdout, everything in $OUT/determinism.json
(or --out).

    python benchmarks/determinism.py                       # on the GPU, the whole quickstart (300 steps)
    python benchmarks/determinism.py --steps 60            # shorter
    python benchmarks/determinism.py --device cpu --steps 3 --warmup-steps 5   # a smoke run on CPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import REPO, child_env, versions  # noqa: E402

VOLATILE = (
    "timing_s/",
    "perf/",
    "rollout/decode_ms_per_step",
    "rollout/graph_capture_s",
    "rollout/wake_s",
    "rollout/loop_s",
    "rollout/assemble_s",
    "rollout/sleep_s",
    "async/idle_s/",
)  # wall-clock numbers
SCORE, HELD_OUT = "critic/score/mean", "val-core/arith/reward/mean@1"


def train(out: Path, name: str, deterministic: bool, args) -> dict:
    run = out / name
    cmd = [
        sys.executable,
        "-m",
        "hybridrl",
        "train",
        "configs/quickstart.yaml",
        f"trainer.device={args.device}",
        f"trainer.deterministic={str(deterministic).lower()}",
        f"trainer.default_local_dir={run}",
        "trainer.logger=[jsonl]",
        "trainer.save_freq=-1",
        "trainer.overwrite=true",
        f"trainer.seed={args.seed}",
        *([f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={max(1, args.steps // 3)}"] if args.steps else []),
        *([f"warmup.steps={args.warmup_steps}"] if args.warmup_steps is not None else []),
    ]
    print(f"[determinism] {name}: {' '.join(cmd[3:])}", flush=True)
    t0 = time.perf_counter()
    with (out / f"{name}.log").open("w") as log:
        rc = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        print("\n".join((out / f"{name}.log").read_text().splitlines()[-30:]))
        raise SystemExit(f"[determinism] {name} failed (rc={rc}), log in {out / (name + '.log')}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "rows": rows}


def compare(a: list[dict], b: list[dict]) -> dict:
    """Where two runs' metrics first differ, how many (step, metric) values differ, the largest gaps."""
    first, differing, total = None, 0, 0
    gaps = {SCORE: 0.0, HELD_OUT: 0.0}
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            if key.startswith(VOLATILE) or key == "step":
                continue
            total += 1
            va, vb = ra.get(key), rb.get(key)
            same = va == vb or (isinstance(va, float) and isinstance(vb, float) and math.isnan(va) and math.isnan(vb))
            if not same:
                differing += 1
                first = first or {"step": ra.get("step"), "metric": key, "a": va, "b": vb}
                if key in gaps and isinstance(va, (int, float)) and isinstance(vb, (int, float)):
                    gaps[key] = max(gaps[key], abs(va - vb))
    return {
        "identical": differing == 0 and len(a) == len(b),
        "steps": (len(a), len(b)),
        "first_difference": first,
        "values_differing": differing,
        "values_compared": total,
        "max_abs_diff_score": gaps[SCORE],
        "max_abs_diff_held_out": gaps[HELD_OUT],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=None, help="RL steps per run; default: the quickstart's 300")
    p.add_argument("--warmup-steps", type=int, default=None, help="supervised warm-up steps; default: the quickstart's")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results/determinism"))
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = {name: train(out, name, name.startswith("det"), args) for name in ("det_a", "det_b", "free_a", "free_b")}
    result = {
        "versions": versions(),
        "device": args.device,
        "steps": args.steps or "quickstart",
        "wall_s": {name: r["wall_s"] for name, r in runs.items()},
        "deterministic": compare(runs["det_a"]["rows"], runs["det_b"]["rows"]),
        "default": compare(runs["free_a"]["rows"], runs["free_b"]["rows"]),
    }
    det_wall = (result["wall_s"]["det_a"] + result["wall_s"]["det_b"]) / 2
    free_wall = (result["wall_s"]["free_a"] + result["wall_s"]["free_b"]) / 2
    result["cost_of_determinism"] = det_wall / free_wall - 1
    print(
        f"\n{'runs':<22}{'identical':>10}{'differing':>12}{'first diff (step, metric)':>44}{'max |d score|':>15}"
        f"{'max |d held-out|':>18}{'wall s (mean)':>15}"
    )
    for label, key, wall in (("deterministic=true", "deterministic", det_wall), ("deterministic=false", "default", free_wall)):
        c = result[key]
        first = c["first_difference"]
        where = f"{first['step']}, {first['metric']}" if first else "-"
        print(
            f"{label:<22}{str(c['identical']):>10}{c['values_differing']:>7}/{c['values_compared']:<5}{where:>43}"
            f"{c['max_abs_diff_score']:>15.4f}{c['max_abs_diff_held_out']:>18.4f}{wall:>15.1f}"
        )
    print(f"cost of trainer.deterministic=true: {100 * result['cost_of_determinism']:+.1f}% wall time")
    (out / "determinism.json").write_text(json.dumps(result, indent=2))
    print(f"[determinism] wrote {out / 'determinism.json'}")


if __name__ == "__main__":
    main()
