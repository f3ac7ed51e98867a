"""The table of `benchmarks/host_overhead.sh`: per run (a trainer.cpu_threads value beside N
neighbours), the step and its stages (medians over steps 2 and later, as scaling_table.py), then
for the profiled step, per worker method: wall, the GPU-busy share (kernels / wall), and the host's
split of the same wall (trace_summary.py --host): Python between ops, op dispatch, kernel launches,
waits for the device.

    python benchmarks/host_table.py OUT_DIR [--skip-step PROFILE_STEP]

OUT_DIR holds one folder per run, `threads<T>_n<N><kind>/`, each with scaling.sh's
`grpo_1gpu.jsonl` and `grpo_1gpu.trace.json`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
METHODS = ("generate", "compute_ref_log_prob", "compute_log_prob", "update_actor")
RUN = re.compile(r"threads(-?\d+)_n(\d+)([a-z])")


def _scaling_table():
    spec = importlib.util.spec_from_file_location("scaling_table", HERE / "scaling_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(out: Path) -> list[tuple[str, Path]]:
    found = sorted(
        (d.name, d) for d in out.iterdir() if d.is_dir() and RUN.fullmatch(d.name) and (d / "grpo_1gpu.jsonl").exists()
    )
    if not found:
        raise SystemExit(f"{out}: no threads<T>_n<N><kind>/grpo_1gpu.jsonl (run benchmarks/host_overhead.sh)")
    return found


def describe(name: str) -> str:
    t, n, kind = RUN.fullmatch(name).groups()
    threads = {"-1": "torch default", "0": "auto"}.get(t, t)
    return f"cpu_threads {threads}" + (f", {n} {'job' if kind == 'j' else 'CPU'} neighbours" if n != "0" else ", alone")


def unprofiled(path: Path, skip_step: int | None, tmp: Path) -> Path:
    """The run's metrics without the profiled step (profiling makes that step several times longer)."""
    if skip_step is None:
        return path
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step") != skip_step]
    tmp.write_text("\n".join(keep) + "\n")
    return tmp


def step_table(out: Path, skip_step: int | None = None) -> str:
    """Medians over steps 2 and later, the profiled step `skip_step` left out."""
    st = _scaling_table()
    head = ["run", "step s", "gen", "ref", "update_actor", "tokens/s", "MFU"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, d in runs(out):
        s = st.summary(unprofiled(d / "grpo_1gpu.jsonl", skip_step, out / f".{name}.steps.jsonl"), 1)
        cells = [s["step"], s["timing_s/gen"], s["timing_s/ref"], s["timing_s/update_actor"]]
        mfu = "-" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%"
        lines.append(
            f"| {describe(name)} | " + " | ".join(st._num(c, ".3f") for c in cells) + f" | {s['tokens_per_gpu']:,.0f} | {mfu} |"
        )
    return "\n".join(lines)


def trace_table(out: Path) -> str:
    head = ["run", "method", "wall ms", "GPU busy", "python ms", "ops ms", "launch ms", "sync ms", "top host ops (self ms)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, d in runs(out):
        path = d / "grpo_1gpu.trace.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        device = next(iter(data["device"].values()))  # one process: one trace
        host = next(iter(data.get("host", {}).values()), {})
        for method in METHODS:
            if method not in device:
                continue
            r, h = device[method], host.get(method, {})
            busy = (r["wall"] - r["idle"]) / r["wall"] if r["wall"] else 0.0
            top = ", ".join(f"{op} {ms:.0f}" for op, ms in h.get("top", [])[:4])
            cells = [f"{r['wall']:.0f}", f"{100 * busy:.0f}%"] + [
                f"{h.get(k, 0.0):.0f}" for k in ("python", "ops", "launch", "sync")
            ]
            lines.append(f"| {describe(name)} | {method} | " + " | ".join(cells) + f" | {top} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the folder benchmarks/host_overhead.sh wrote")
    ap.add_argument("--skip-step", type=int, default=None, help="the profiled step, left out of the medians")
    args = ap.parse_args()
    if not args.out.is_dir():
        raise SystemExit(f"{args.out}: no such folder (run benchmarks/host_overhead.sh first)")
    print(step_table(args.out, args.skip_step))
    out = args.out
    print()
    print(trace_table(out))


if __name__ == "__main__":
    main()
