"""`hybridrl dashboard` over many runs: scan time, bytes per poll, and the page's height.

    python benchmarks/dashboard_runs.py --runs 100 --steps 300 [--chromium]

Writes N synthetic runs (verl's metric names, `--steps` lines each) under a temporary folder,
serves them, and measures: the folder scan (cold: every run read; warm: nothing changed, a stat
per file), the bytes of the page's first poll, and of a poll after two runs wrote one more step
(the dashboard before the delta protocol re-sent everything), and with --chromium the height of
the page in headless Chromium (`data-height`, the footer's bottom). Works against older trees
too (PYTHONPATH=<an old checkout>), which is how docs/observability.md got its "before" numbers.
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

KEYS = [
    "critic/score/mean",
    "critic/score/max",
    "critic/score/min",
    "critic/advantages/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/pg_clipfrac",
    "actor/lr",
    "response_length/mean",
    "response_length/clip_ratio",
    "perf/throughput",
    "perf/max_memory_allocated_gb",
    "timing_s/gen",
    "timing_s/reward",
    "timing_s/old_log_prob",
    "timing_s/ref",
    "timing_s/update_actor",
    "timing_s/step",
]


def make_runs(root: Path, n: int, steps: int, seed: int = 0) -> list[Path]:
    """`n` runs `proj/expNNN-lr...` of `steps` metric lines; a third finished, a third stalled."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        run = root / "proj" / f"exp{i:03d}-{'lr1e-6' if i % 2 else 'lr3e-6'}"
        run.mkdir(parents=True)
        lines = []
        for s in range(1, steps + 1):
            row = {"step": s, **{k: round(rng.random(), 6) for k in KEYS}}
            row["critic/score/mean"] = round(min(1.0, 0.2 + s / steps * (0.5 + 0.3 * (i % 5) / 4) + 0.03 * rng.random()), 6)
            lines.append(json.dumps(row))
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (run / "config.yaml").write_text(f"trainer:\n  total_training_steps: {steps * 2}\n  experiment_name: exp{i:03d}\n")
        if i % 3 == 0:
            (run / "run_summary.json").write_text("{}")
        out.append(run)
    return out


def grow(run: Path, step: int) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, **{k: 0.5 for k in KEYS}}) + "\n")


def page_height(url: str, budget_ms: int = 6000) -> int | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return None
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                "--window-size=1400,1000",
                "--dump-dom",
                "--run-all-compositor-stages-before-draw",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout

    m = re.search(r'data-height="(\d+)"', dom)
    return int(m.group(1)) if m else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--chromium", action="store_true", help="also measure the page's height in headless Chromium")
    args = ap.parse_args()
    from hybridrl.tracking.dashboard import Dashboard, RunsFolder

    tmp = Path(tempfile.mkdtemp())
    try:
        runs = make_runs(tmp / "runs", args.runs, args.steps)
        folder = RunsFolder(tmp / "runs")
        t0 = time.perf_counter()
        folder.runs()
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(5):
            t0 = time.perf_counter()
            folder.runs()
            warm.append(time.perf_counter() - t0)
        size = lambda d: len(json.dumps(d, separators=(",", ":")).encode())  # noqa: E731
        names = [f"proj/{r.name}" for r in runs]
        compared = names[-5:]
        if "series" in inspect.signature(RunsFolder.data).parameters:  # as the page asks
            first = folder.data(series=[])  # the run list
            load = folder.data(first["cursor"], series=[], load=compared)  # the compared runs' curves
            for r in runs[-2:]:
                grow(r, args.steps + 1)
            second = folder.data(load["cursor"], series=compared)
            third = folder.data(second["cursor"], series=compared)
            sizes = {"poll_bytes_first": size(first), "poll_bytes_compared_curves": size(load)}
        else:  # before: every poll is everything
            first = folder.data()
            for r in runs[-2:]:
                grow(r, args.steps + 1)
            second, third = folder.data(), folder.data()
            sizes = {"poll_bytes_first": size(first)}
        result = {
            "runs": args.runs,
            "steps": args.steps,
            "metrics_jsonl_bytes_per_run": (runs[0] / "metrics.jsonl").stat().st_size,
            "scan_cold_s": round(cold, 3),
            "scan_warm_s": round(min(warm), 4),
            **sizes,
            "poll_bytes_after_two_runs_grew": size(second),
            "poll_bytes_nothing_changed": size(third),
        }
        if args.chromium:
            dash = Dashboard(tmp / "runs", port=0, interval_ms=1000).start()
            try:
                result["page_height_px"] = page_height(dash.url)
                ten = ",".join(names[::10])
                result["page_height_px_10_compared"] = page_height(dash.url + "#runs?compare=" + ten)
                # (the dashboard before the run list had no data-height: measure a report of the same runs)
            finally:
                dash.stop()
            if result["page_height_px"] is None:
                from hybridrl.tracking.report import payload, render_page
                from hybridrl.tracking.runlog import load_run

                html = render_page(payload([load_run(r, r.name) for r in runs]), title="t")
                probe = (
                    "<script>setTimeout(()=>{const f=document.querySelector('footer');"
                    "document.body.dataset.height=String(Math.round(f.getBoundingClientRect().bottom+scrollY));},3000)</script>"
                )
                page = tmp / "report.html"
                page.write_text(html.replace("</body>", probe + "</body>"))
                result["page_height_px"] = page_height(page.as_uri())
                result["page_height_of"] = "the report page of the same runs (this tree's page does not report its height)"
        print(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
