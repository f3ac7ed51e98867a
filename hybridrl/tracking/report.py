"""The run report: one self-contained HTML file (the page, its script, the charting library and
the data inlined), and the JSON the live dashboard serves to the same page.

The page (hybridrl/assets/report/) draws with uPlot (hybridrl/assets/uplot/, MIT): 51 kB
minified, canvas-based, fast on 10^5-point series, no dependencies. docs/observability.md says
why it was chosen. Large runs stay fast because every curve is downsampled here to at most
`max_points` points (bucket means; the last step is always kept), at most `max_groups` prompt
groups of each kind are embedded (all the groups of evenly spaced steps), and the rollout
inspector pages through them in the browser.
"""

from __future__ import annotations

import html
import json
import math
import statistics
import time
from importlib import resources

from hybridrl.tracking.runlog import RunData

MAX_POINTS = 1500
MAX_GROUPS = 3000  # prompt groups per run and kind (training / validation) embedded in a report


def _asset(*parts: str) -> str:
    return resources.files("hybridrl").joinpath("assets", *parts).read_text()


def downsample(rows: list[dict], max_points: int = MAX_POINTS) -> dict[str, list]:
    """Metric rows -> columns {"step": [...], key: [... or None]} with at most `max_points` rows.

    Above the limit, consecutive rows are averaged in equal buckets (each key over the rows that
    have it; None where none do) and a bucket is placed at its last step, so the last step shown
    is the run's last step.
    """
    rows = sorted(rows, key=lambda r: r["step"])
    keys = sorted({k for r in rows for k in r if k != "step"})
    if len(rows) <= max_points:
        buckets = [[r] for r in rows]
    else:
        size = len(rows) / max_points
        buckets = [rows[int(i * size) : int((i + 1) * size)] for i in range(max_points)]
        buckets = [b for b in buckets if b]
    cols: dict[str, list] = {"step": [b[-1]["step"] for b in buckets]}
    for k in keys:
        col = []
        for b in buckets:
            vals = [r[k] for r in b if k in r]
            col.append(sum(vals) / len(vals) if vals else None)
        cols[k] = col
    return cols


def summarize(run: RunData) -> dict:
    """The numbers of the report's summary table (also `/metrics` and the end-of-run summary)."""
    rows, cfg = run.metrics, run.config or {}
    trainer, arr, algo = _section(cfg, "trainer"), _section(cfg, "actor_rollout_ref"), _section(cfg, "algorithm")
    steps = [r for r in rows if r["step"] > 0]
    reward_key = next(
        (k for k in ("critic/score/mean", "rewards/accuracies", "mean_token_accuracy") if any(k in r for r in steps)), None
    )
    rewards = [r[reward_key] for r in steps if reward_key in r] if reward_key else []
    k = max(1, len(rewards) // 10)
    val_keys = sorted({key for r in rows for key in r if key.startswith(("val-core/", "val/"))})
    val = {}
    for key in val_keys:
        pts = [(r["step"], r[key]) for r in rows if key in r]
        lower_is_better = key.endswith(("loss", "perplexity"))
        best = min(pts, key=lambda p: p[1]) if lower_is_better else max(pts, key=lambda p: p[1])
        val[key] = {
            "first": pts[0][1],
            "first_step": pts[0][0],
            "last": pts[-1][1],
            "last_step": pts[-1][0],
            "best": best[1],
            "best_step": best[0],
        }
    stage_keys = sorted({key for r in steps for key in r if key.startswith("timing_s/") and key != "timing_s/step"})
    stage_means = {key.removeprefix("timing_s/"): _mean([r[key] for r in steps if key in r]) for key in stage_keys}
    timed = [r for r in steps if "timing_s/step" in r]
    step_times = [r["timing_s/step"] for r in timed]
    # The first step compiles, captures CUDA graphs and warms caches (often 10x a later one), so the
    # typical step is the median of the steps after it; one recorded step is its own median.
    steady = timed[1:] or timed
    stage_medians = {key.removeprefix("timing_s/"): _median([r[key] for r in steady if key in r]) for key in stage_keys}
    name = algo.get("name", "rl")
    return {
        "name": run.name,
        "path": str(run.path),
        "model": _section(arr, "model").get("path"),
        "algorithm": (algo.get("adv_estimator") if name == "rl" else name) if algo else None,
        "last_step": run.last_step,
        "total_steps": _number(trainer.get("total_training_steps")),
        "device": trainer.get("device"),
        "devices": _devices(trainer),
        "train_time_s": sum(step_times),
        "mean_step_s": _mean(step_times),
        "stage_mean_s": stage_means,
        "first_step": timed[0]["step"] if timed else None,
        "first_step_s": step_times[0] if step_times else None,
        "median_step_s": _median([r["timing_s/step"] for r in steady]),
        "median_steps": [steady[0]["step"], steady[-1]["step"]] if steady else None,
        "stage_median_s": stage_medians,
        "reward_key": reward_key,
        "reward_first": _mean(rewards[:k]) if rewards else None,
        "reward_last": _mean(rewards[-k:]) if rewards else None,
        "reward_window": k,
        "validation": val,
        "samples": len(run.samples),
        "updated_age_s": max(0.0, time.time() - run.mtime) if run.mtime else None,
        "finished": (run.path / "run_summary.json").exists() if run.path.is_dir() else True,
        "error": run.error,
    }


def _section(cfg: dict, key: str) -> dict:
    """cfg[key] when it is a mapping, else {}: a hand-edited config.yaml may hold anything there."""
    v = cfg.get(key) if isinstance(cfg, dict) else None
    return v if isinstance(v, dict) else {}


def _number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _devices(trainer: dict):
    nodes, per_node = _number(trainer.get("nnodes", 1)), _number(trainer.get("n_gpus_per_node", 1))
    return nodes * per_node if trainer and nodes is not None and per_node is not None else None


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def _median(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def thin_samples(groups: list[dict], max_groups: int) -> list[dict]:
    """At most `max_groups` prompt groups of each kind: all the groups of evenly spaced steps
    (the first and the last step always among them), so the inspector still spans the run and
    the diff view still finds a prompt at several steps."""
    out = []
    for kind in ("train", "val"):
        mine = [g for g in groups if g["kind"] == kind]
        steps = sorted({g["step"] for g in mine})
        if len(mine) > max_groups and steps:
            per_step = len(mine) / len(steps)
            n = max(2, int(max_groups / per_step))
            keep = {steps[round(i * (len(steps) - 1) / (n - 1))] for i in range(n)} if n < len(steps) else set(steps)
            mine = [g for g in mine if g["step"] in keep][-max_groups:]
        out += mine
    return sorted(out, key=lambda g: (g["step"], g["kind"] != "train"))


def run_payload(
    run: RunData,
    config_diff: list | None = None,
    max_points: int = MAX_POINTS,
    max_groups: int = MAX_GROUPS,
    *,
    samples: bool = True,
) -> dict:
    """One run's part of the page's data. `samples=False` leaves the prompt groups out (the
    dashboard serves them one run at a time, at /api/samples)."""
    groups = thin_samples(run.samples, max_groups) if samples else []
    return {
        "name": run.name,
        "summary": summarize(run),
        "config_diff": config_diff or [],
        "series": downsample(run.metrics, max_points),
        "points": len(run.metrics),
        "samples": groups,
        "samples_dropped": len(run.samples) - len(groups) if samples else 0,
        "notes": run.notes,
        "error": run.error,
    }


def payload(runs: list[RunData], diffs: dict | None = None, max_points: int = MAX_POINTS, max_groups: int = MAX_GROUPS) -> dict:
    diffs = diffs or {}
    return {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": [run_payload(r, diffs.get(r.name), max_points, max_groups) for r in runs],
    }


def render_page(data: dict | None, *, title: str, live: dict | None = None) -> str:
    """The page: inline CSS, uPlot, the page script and (for a report) the data.

    `live` ({"url": "/api/data", "interval_ms": 2000}) makes the page poll the dashboard instead
    of reading inlined data.
    """

    def script_json(obj) -> str:  # JSON safe inside <script>: no "</script>" can close the tag early
        return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")

    return _asset("report", "page.html").format_map(
        {
            "title": html.escape(title),
            "uplot_css": _asset("uplot", "uPlot.min.css"),
            "page_css": _asset("report", "report.css"),
            "uplot_js": _asset("uplot", "uPlot.iife.min.js"),
            "page_js": _asset("report", "report.js"),
            "data": script_json(data),
            "live": script_json(live),
        }
    )
