"""`hybridrl report RUN_DIR [RUN_DIR ...] [--out report.html]`: one self-contained HTML file."""

from __future__ import annotations

import copy
import sys
from pathlib import Path


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def config_diff(saved: dict) -> list[tuple[str, object, object]]:
    """(key, value, default) for every key of a run's resolved config.yaml that differs from the
    schema's default, leaving out the values `resolve` derived from other keys (e.g. a
    tokenizer_path that is the model path)."""
    from hybridrl.config import Config, ConfigError, config_from_dict, resolve, to_dict

    if not saved:
        return []
    defaults = flatten(to_dict(Config()))
    values = flatten(saved)
    diff = [(k, v, defaults[k]) for k, v in values.items() if k in defaults and v != defaults[k]]
    out = []
    for k, v, d in diff:
        if d is None and _derived(saved, k, v, config_from_dict, resolve, to_dict, ConfigError):
            continue
        out.append((k, v, d))
    return out


def _derived(saved, key, value, config_from_dict, resolve, to_dict, ConfigError) -> bool:
    tree = copy.deepcopy(saved)
    node = tree
    *parents, leaf = key.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = None
    try:
        return flatten(to_dict(resolve(config_from_dict(tree, check=False)))).get(key) == value
    except (ConfigError, KeyError, TypeError, ValueError):
        return False


def load_runs(paths: list[str]):
    from hybridrl.tracking.runlog import load_run

    runs, names = [], set()
    for p in paths:
        run = load_run(Path(p))
        if run.name in names:  # two runs called "run": tell them apart by their parent folder
            run.name = f"{Path(p).resolve().parent.name}/{run.name}"
        names.add(run.name)
        runs.append(run)
    return runs


def build_report(
    paths: list[str], *, title: str | None = None, max_points: int | None = None, max_samples: int | None = None
) -> tuple[str, list]:
    """(the HTML of the report of `paths`, the runs read)."""
    from hybridrl.tracking.report import MAX_GROUPS, MAX_POINTS, payload, render_page

    runs = load_runs(paths)
    diffs = {r.name: config_diff(r.config) for r in runs}
    data = payload(runs, diffs, max_points or MAX_POINTS, max_samples or MAX_GROUPS)
    title = title or "hybridrl report: " + ", ".join(r.name for r in runs)
    return render_page(data, title=title), runs


def cmd_report(args) -> int:
    from hybridrl.tracking.runlog import RunError

    try:
        html, runs = build_report(args.runs, title=args.title, max_points=args.max_points, max_samples=args.max_samples)
    except RunError as e:  # a run's own files are damaged: say which, no traceback
        print(f"hybridrl: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html)
    for r in runs:
        for note in r.notes:
            print(f"hybridrl report: note: {note}", file=sys.stderr)
    steps = ", ".join(f"{r.name}: {r.last_step} steps, {len(r.samples)} sample groups" for r in runs)
    print(f"wrote {out} ({len(html) // 1024} KiB; {steps}); open it in a browser, no network needed")
    return 0


def add_parser(sub) -> None:
    s = sub.add_parser("report", help="one self-contained HTML report of one or more runs (curves, timing, samples)")
    s.add_argument(
        "runs", nargs="+", metavar="RUN_DIR", help="run directories (runs/<project>/<experiment>) or metrics .jsonl files"
    )
    s.add_argument("--out", default="report.html", help="the HTML file to write (default: report.html)")
    s.add_argument("--title", default=None, help="page title (default: the run names)")
    s.add_argument(
        "--max-points", type=int, default=None, help="points per curve; longer runs are averaged in buckets (default 1500)"
    )
    s.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="prompt groups per run and kind embedded; above it, all groups of evenly spaced steps (default 3000)",
    )
    s.set_defaults(fn=cmd_report)
