"""The weak-scaling table of `benchmarks/scaling.sh`, from the runs' metrics.jsonl files.

    python benchmarks/scaling_table.py OUT_DIR 1 2 4 [--ppo PPO_GPUS SPLIT_ACTOR] [--modes sync one_step_off async]
        [--baseline OTHER_OUT_DIR/grpo_1gpu.jsonl]

OUT_DIR holds `grpo_<n>gpu.jsonl` for each GPU count (and `gae_colocated.jsonl`,
`gae_split.jsonl` with --ppo). Every number is the median over steps 2 and later (step 1 warms
up); tokens/s per GPU = the step's tokens / step time / GPUs; efficiency = tokens/s per GPU over
the smallest count's (or, with --baseline, the given run's: a variant measured on 2 GPUs only
against another OUT_DIR's 1-GPU row); MFU per GPU = `perf/mfu/actor` (the update's, per rank; `-` where the
device reports no peak FLOPs, e.g. on CPU). A stage a configuration skips (no old log-prob pass
with `reuse_on_policy_log_prob`, no critic in GRPO) shows `-`.

With --modes naming an off-policy mode, a second table compares trainer.mode at equal GPUs: the
runs `<mode>_<n>gpu_r<POOL>.jsonl` (POOL rollout GPUs of their own, 0 = colocated) against sync
(`grpo_<n>gpu.jsonl`): tokens/s per GPU relative to sync's, the staleness, and the trainer's and
the rollout engine's idle shares (benchmarks/async.py's definitions, over steps 2 and later).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
from pathlib import Path

STAGES = [  # (metric, column)
    ("timing_s/gen", "gen"),
    ("timing_s/old_log_prob", "old log-prob"),
    ("timing_s/ref", "ref"),
    ("timing_s/values", "values"),
    ("timing_s/update_critic", "update_critic"),
    ("timing_s/update_actor", "update_actor"),
]
CRITIC = ("timing_s/values", "timing_s/update_critic")


def summary(path: Path, gpus: int) -> dict[str, float | None]:
    """Medians over steps 2+ of the step time, its stages, tokens/s per GPU and MFU."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 2 and "timing_s/step" in r]
    if not steps:
        raise SystemExit(f"{path}: no step 2 or later with timing_s/step (run at least 2 steps)")

    def median(key: str) -> float | None:
        values = [r[key] for r in steps if key in r]
        return statistics.median(values) if values else None

    out = {key: median(key) for key, _ in STAGES}
    out["step"] = median("timing_s/step")
    out["tokens_per_gpu"] = median("perf/total_num_tokens") / out["step"] / gpus
    out["mfu"] = median("perf/mfu/actor")
    return out


def _gpus(path: Path) -> int:
    """The GPU count in a run file's name (`grpo_<n>gpu.jsonl`, `<mode>_<n>gpu_r<pool>.jsonl`)."""
    found = re.search(r"_(\d+)gpu", path.name)
    if not found:
        raise SystemExit(f"{path}: the file name does not say its GPU count (grpo_<n>gpu.jsonl)")
    return int(found.group(1))


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(out: Path, counts: list[int], ppo: tuple[int, int] | None = None, baseline: Path | None = None) -> str:
    runs = [("GRPO colocated", n, out / f"grpo_{n}gpu.jsonl") for n in counts]
    if baseline is not None:  # another OUT_DIR's run (e.g. the 1-GPU row, for a variant measured on more GPUs only)
        if not baseline.exists():
            raise SystemExit(f"--baseline {baseline}: no such file")
        runs.insert(0, (f"GRPO colocated, baseline {baseline.parent.name}/{baseline.name}", _gpus(baseline), baseline))
    if ppo:
        g, a = ppo
        runs += [
            ("PPO (gae) colocated", g, out / "gae_colocated.jsonl"),
            (f"PPO (gae) split {a} + {g - a}", g, out / "gae_split.jsonl"),
        ]
    rows = [(label, n, summary(path, n)) for label, n, path in runs if path.exists()]
    if not rows:
        raise SystemExit(f"{out}: no run's metrics found (grpo_<n>gpu.jsonl)")
    stages = [(k, name) for k, name in STAGES if k not in CRITIC or any(s[k] is not None for _, _, s in rows)]
    head = ["run", "GPUs", "step s"] + [name for _, name in stages] + ["tokens/s per GPU", "efficiency", "MFU per GPU"]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    base = next((s["tokens_per_gpu"] for label, _, s in rows if label.startswith("GRPO")), None)
    for label, n, s in rows:
        eff = f"{s['tokens_per_gpu'] / base:.2f}" if label.startswith("GRPO") and base else ""
        mfu = "-" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%"
        cells = [label, str(n), _num(s["step"], ".2f")] + [_num(s[k], ".2f") for k, _ in stages]
        cells += [f"{s['tokens_per_gpu']:,.0f}", eff, mfu]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _async_benchmark():
    """benchmarks/async.py as a module (its step_summary: staleness and idle shares)."""
    spec = importlib.util.spec_from_file_location("async_benchmark", Path(__file__).with_name("async.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mode_table(out: Path, counts: list[int], modes: list[str]) -> str | None:
    """sync vs one_step_off vs async at each GPU count; None when no off-policy run is there."""
    if all(mode == "sync" for mode in modes):
        return None
    step_summary = _async_benchmark().step_summary
    head = ["mode", "GPUs", "rollout pool", "step s", "tokens/s per GPU", "relative to sync", "staleness mean / max"]
    head += ["trainer idle", "rollout idle"]
    lines, found = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"], False
    for n in counts:
        sync_path = out / f"grpo_{n}gpu.jsonl"
        base = summary(sync_path, n)["tokens_per_gpu"] if sync_path.exists() else None
        for mode in modes:
            paths = [sync_path] if mode == "sync" else sorted(out.glob(f"{mode}_{n}gpu_r*.jsonl"))
            for path in (p for p in paths if p.exists()):
                found |= mode != "sync"
                s = summary(path, n)
                rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
                a = step_summary(rows, skip=1)  # steps 2 and later, as `summary`
                pool = "-" if mode == "sync" else path.stem.rsplit("_r", 1)[1]
                pool = "colocated" if pool == "0" else pool
                rel = "-" if base is None else f"{s['tokens_per_gpu'] / base:.2f}"
                cells = [mode, str(n), pool, f"{s['step']:.2f}", f"{s['tokens_per_gpu']:,.0f}", rel]
                cells += [f"{a['staleness_mean']:.2f} / {a['staleness_max']:.0f}"]
                cells += [f"{100 * a['idle_share_trainer']:.1f}%", f"{100 * a['idle_share_rollout']:.1f}%"]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) if found else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("counts", type=int, nargs="+")
    parser.add_argument("--ppo", type=int, nargs=2, metavar=("PPO_GPUS", "SPLIT_ACTOR"))
    parser.add_argument(
        "--baseline",
        type=Path,
        help="efficiency against this run file (another OUT_DIR's grpo_<n>gpu.jsonl), not the smallest count",
    )
    parser.add_argument("--modes", nargs="*", default=["sync"], help="trainer.mode runs to compare (scaling.sh MODES)")
    args = parser.parse_args(argv)
    print(table(args.out, args.counts, tuple(args.ppo) if args.ppo else None, args.baseline))
    modes = mode_table(args.out, args.counts, args.modes)
    if modes:
        print("\n" + modes)


if __name__ == "__main__":
    main()
