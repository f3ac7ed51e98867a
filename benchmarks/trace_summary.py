"""Where a profiled step's time went, per worker method and rank: compute, communication, and the
communication no compute hid (issue 40: "exposed all-gathers and reduce-scatters").

    python benchmarks/trace_summary.py RUN_DIR/profile/step_N [--json OUT.json]

Reads every `<role>_rank<R>.json` Chrome trace that `trainer.profile_steps` wrote there. Each
worker method called while the profiler runs is a range `hybridrl/<method>` in the trace
(`distributed/dispatch.py`); on a GPU run, Kineto copies the range onto the device's timeline as a
`gpu_user_annotation`, and that is the window used (the CPU range on a CPU run, where no kernels
exist). Within a window, per rank (times in ms):

- wall: the window's length;
- compute: the union of the device kernels that are not collectives (memcpy/memset included);
- comm: the union of the collective kernels (NCCL's names start with `nccl`);
- exposed comm: comm time during which no compute kernel ran (what overlapping would save);
- idle: wall minus the union of all kernels (the device waited: host work, dispatch, stragglers).

The table ends with each method's mean over ranks and its max (the slowest rank sets the step).

`--host` adds where the host's time went inside each method's CPU range (issue 49: "the GPU
waits on the host"), per trace, on the thread that ran the method:
- python: time inside no traced op (the interpreter's own work between ops);
- sync: CUDA runtime calls that wait for the device (synchronizes, blocking copies);
- launch: kernel launches and other CUDA runtime calls;
- ops: the self time of host operators (`aten::*`: on a GPU run their dispatch, on CPU tensors
  their work too), with the operators of the most self time listed.
A method that another calls (update_actor runs compute_log_prob over its later mini-batches with
actor.reuse_on_policy_log_prob) is a row of its own and is inside its caller's row too.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

PREFIX = "hybridrl/"
KERNEL_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def is_comm(name: str) -> bool:
    return name.lower().startswith("nccl")


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def clip(intervals: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def subtract(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the (merged) intervals xs not covered by the (merged) intervals ys."""
    out = []
    for a, b in xs:
        cur = a
        for c, d in ys:
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
            if cur >= b:
                break
        if cur < b:
            out.append((cur, b))
    return out


def summarize_trace(events: list[dict]) -> dict[str, dict[str, float]]:
    """{method: {wall, compute, comm, exposed_comm, idle, calls}} in ms for one process's trace."""
    spans = [e for e in events if e.get("ph") == "X"]
    kernels = [e for e in spans if e.get("cat") in KERNEL_CATS]
    gpu_windows = [e for e in spans if e.get("cat") == "gpu_user_annotation" and e["name"].startswith(PREFIX)]
    cpu_windows = [e for e in spans if e.get("cat") == "user_annotation" and e["name"].startswith(PREFIX)]
    windows = gpu_windows or cpu_windows
    compute = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if not is_comm(k["name"])])
    comm = union([(k["ts"], k["ts"] + k["dur"]) for k in kernels if is_comm(k["name"])])
    out: dict[str, dict[str, float]] = defaultdict(
        lambda: dict.fromkeys(("wall", "compute", "comm", "exposed_comm", "idle", "calls"), 0.0)
    )
    for w in windows:
        lo, hi = w["ts"], w["ts"] + w["dur"]
        c, m = clip(compute, lo, hi), clip(comm, lo, hi)
        row = out[w["name"][len(PREFIX) :]]
        row["wall"] += (hi - lo) / 1e3
        row["compute"] += length(c) / 1e3
        row["comm"] += length(m) / 1e3
        row["exposed_comm"] += length(subtract(m, c)) / 1e3
        row["idle"] += (hi - lo - length(union(c + m))) / 1e3
        row["calls"] += 1
    return dict(out)


HOST_CATS = {"cpu_op", "cuda_runtime", "cuda_driver"}
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cuStreamSynchronize")


def self_times(events: list[dict]) -> list[tuple[dict, float]]:
    """(event, self time in us) for nested host spans of one thread: each span's length minus the
    time of the spans directly inside it."""
    spans = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    out: list[list] = []  # [event, self]
    stack: list[list] = []
    for e in spans:
        while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
            stack.pop()
        entry = [e, float(e["dur"])]
        if stack:
            stack[-1][1] -= min(e["dur"], stack[-1][0]["ts"] + stack[-1][0]["dur"] - e["ts"])
        stack.append(entry)
        out.append(entry)
    return [(e, max(s, 0.0)) for e, s in out]


def kind_of(event: dict) -> str:
    if event["cat"] == "cpu_op":
        return "ops"
    return "sync" if event["name"].startswith(SYNC_CALLS) else "launch"


def summarize_host(events: list[dict], top: int = 8) -> dict[str, dict]:
    """{method: {wall, python, sync, launch, ops, launches, top: [(op, ms)]}} in ms over the CPU ranges
    `hybridrl/<method>` of one process's trace, on the thread that ran each range."""
    spans = [e for e in events if e.get("ph") == "X"]
    windows = [e for e in spans if e.get("cat") == "user_annotation" and e["name"].startswith(PREFIX)]
    host = defaultdict(list)
    for e in spans:
        if e.get("cat") in HOST_CATS:
            host[(e.get("pid"), e.get("tid"))].append(e)
    timed = {thread: self_times(evs) for thread, evs in host.items()}
    out: dict[str, dict] = {}
    for w in windows:
        lo, hi = w["ts"], w["ts"] + w["dur"]
        row = out.setdefault(
            w["name"][len(PREFIX) :],
            {"wall": 0.0, "python": 0.0, "sync": 0.0, "launch": 0.0, "ops": 0.0, "launches": 0, "top": defaultdict(float)},
        )
        inside = [(e, s) for e, s in timed.get((w.get("pid"), w.get("tid")), []) if e["ts"] >= lo and e["ts"] + e["dur"] <= hi]
        row["wall"] += (hi - lo) / 1e3
        for e, s in inside:
            kind = kind_of(e)
            row[kind] += s / 1e3
            if kind == "ops":
                row["top"][e["name"]] += s / 1e3
            elif "Launch" in e["name"]:
                row["launches"] += 1
        covered = length(union([(e["ts"], e["ts"] + e["dur"]) for e, _ in inside]))
        row["python"] += (hi - lo - covered) / 1e3
    for row in out.values():
        row["top"] = sorted(row["top"].items(), key=lambda kv: -kv[1])[:top]
    return out


def host_table(per_trace: dict[str, dict[str, dict]]) -> str:
    cols = ("wall", "python", "sync", "launch", "ops")
    lines = ["| trace | method | " + " | ".join(f"{c} ms" for c in cols) + " | launches | top host ops (self ms) |"]
    lines.append("| --- " * (4 + len(cols)) + "|")
    for name, rows in per_trace.items():
        for method, r in sorted(rows.items(), key=lambda kv: -kv[1]["wall"]):
            top = ", ".join(f"{op} {ms:.1f}" for op, ms in r["top"])
            lines.append(f"| {name} | {method} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + f" | {r['launches']} | {top} |")
    return "\n".join(lines)


def load(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def traces_in(step_dir: Path) -> list[Path]:
    traces = sorted(p for p in Path(step_dir).glob("*.json") if re.fullmatch(r".+_rank\d+", p.stem))
    if not traces:
        raise SystemExit(f"{step_dir}: no <role>_rank<R>.json traces (run with trainer.profile_steps=[N])")
    return traces


def summarize_dir(step_dir: Path) -> dict[str, dict[str, dict[str, float]]]:
    """{trace name (role_rankR): summarize_trace(...)} for every trace in a profile step directory."""
    return {p.stem: summarize_trace(load(p)) for p in traces_in(step_dir)}


def table(per_rank: dict[str, dict[str, dict[str, float]]]) -> str:
    cols = ("wall", "compute", "comm", "exposed_comm", "idle")
    lines = ["| trace | method | calls | " + " | ".join(f"{c} ms" for c in cols) + " |", "| --- " * (3 + len(cols)) + "|"]
    methods: dict[str, list[dict[str, float]]] = defaultdict(list)
    for name, rows in per_rank.items():
        for method, r in sorted(rows.items(), key=lambda kv: -kv[1]["wall"]):
            methods[method].append(r)
            lines.append(f"| {name} | {method} | {r['calls']:.0f} | " + " | ".join(f"{r[c]:.1f}" for c in cols) + " |")
    for method, rs in sorted(methods.items(), key=lambda kv: -max(r["wall"] for r in kv[1])):
        mean = {c: sum(r[c] for r in rs) / len(rs) for c in cols}
        lines.append(f"| mean of {len(rs)} | {method} | | " + " | ".join(f"{mean[c]:.1f}" for c in cols) + " |")
        lines.append(f"| max of {len(rs)} | {method} | | " + " | ".join(f"{max(r[c] for r in rs):.1f}" for c in cols) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("step_dir", type=Path)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--host", action="store_true", help="also where the host's time went in each method")
    args = ap.parse_args()
    per_rank = summarize_dir(args.step_dir)
    print(table(per_rank))
    result: dict = {"device": per_rank}
    if args.host:
        host = {p.stem: summarize_host(load(p)) for p in traces_in(args.step_dir)}
        print()
        print(host_table(host))
        result["host"] = host
    if args.json:
        args.json.write_text(json.dumps(result if args.host else per_rank, indent=1))


if __name__ == "__main__":
    main()
