"""Plot training curves as PNG: a run's metrics.jsonl, or benchmarks/vs_trl.py's vs_trl.json.

    python benchmarks/plot_curves.py runs/gsm8k/grpo/metrics.jsonl --out docs/img/gsm8k_grpo.png
    python benchmarks/plot_curves.py vs_trl_out/vs_trl.json --out docs/img/vs_trl.png

A metrics.jsonl gives one panel per key in --keys (default: reward, GSM8K format rate and strict
accuracy when present, response length, KL) against
the step; vs_trl.json gives reward and response length against wall-clock seconds, one line per trainer.
Needs matplotlib (`pip install matplotlib`); nothing else in hybridrl does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_KEYS = (
    "critic/score/mean",
    "reward/gsm8k_format/mean",
    "reward/gsm8k_strict_acc/mean",
    "response_length/mean",
    "actor/kl_loss",
)  # keys a run lacks are left out


def load_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if key in r and r.get("step", 0) > 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(rows: list[dict], keys: list[str], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(k in r for r in rows)]
    if not keys:
        raise SystemExit(f"none of the keys appear in the metrics; keys present: {sorted({k for r in rows for k in r})[:40]}")
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        x, y = series(rows, key)
        ax.plot(x, y, lw=1.2)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    val = [k for k in {k for r in rows for k in r} if k.startswith("val-core/")]
    for k in val[:1]:  # validation accuracy, if any, over the first panel
        x, y = [r["step"] for r in rows if k in r], [r[k] for r in rows if k in r]
        axes[0][0].plot(x, y, "o-", ms=3, label=k.split("/", 1)[1])
        axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def plot_vs_trl(res: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for name in ("hybridrl", "trl"):
        r = res.get(name) or {}
        cycles = r.get("cycles") or []
        t = [c["t_end_s"] for c in cycles]
        for ax, key in zip(axes, ("reward", "response_length")):
            ax.plot(t, [c[key] for c in cycles], ".-", lw=1.2, label=name)
    for ax, key in zip(axes, ("reward (mean score)", "response length (tokens)")):
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("training wall-clock seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="metrics.jsonl of a run, or vs_trl.json")
    ap.add_argument("--out", required=True, help="PNG file to write")
    ap.add_argument("--keys", nargs="*", default=list(DEFAULT_KEYS), help="metrics.jsonl keys to plot")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    path = Path(args.path)
    if path.suffix == ".json":
        plot_vs_trl(json.loads(path.read_text()), Path(args.out), args.title)
    else:
        plot_run(load_metrics(path), args.keys, Path(args.out), args.title)


if __name__ == "__main__":
    main()
