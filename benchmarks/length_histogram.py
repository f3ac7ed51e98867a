"""A real run's response lengths as a forced-length schedule (rollout.forced_response_lengths,
distribution=histogram; docs/async.md, the long-tail benchmark).

Reads the per-response token counts of JSONL files: `hybridrl eval --output` rows
(`response_length`) or a run's samples.jsonl prompt groups (`response_lengths`), e.g. a real
model sampled on GSM8K at the length limit of the benchmark:

    hybridrl eval --model MODEL --data gsm8k_test.parquet --n 8 --temperature 1.0 \\
        --max-response-length 4096 --output eval.jsonl
    python benchmarks/length_histogram.py eval.jsonl --out lengths.json
    ... actor_rollout_ref.rollout.forced_response_lengths.distribution=histogram \\
        actor_rollout_ref.rollout.forced_response_lengths.histogram=lengths.json

Bins are log-spaced (the tail spans decades) with integer edges; the longest length gets a bin of
its own, [max, max + 1), so the responses cut at the limit stay a point mass instead of spreading
over the last bin. Prints the quantiles and the lognormal (median, sigma) of the same lengths.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np


def read_lengths(paths: list[Path]) -> np.ndarray:
    """Every response length in the files (int64)."""
    out: list[int] = []
    for path in paths:
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("response_length") is not None:
                out.append(int(row["response_length"]))
            elif row.get("response_lengths"):
                out += [int(x) for x in row["response_lengths"] if x is not None]
            else:
                raise SystemExit(f"{path}, line {i + 1}: no response_length (hybridrl eval --output) or response_lengths")
    if not out:
        raise SystemExit(f"no response lengths in {', '.join(map(str, paths))}")
    return np.asarray(out, dtype=np.int64)


def histogram(lengths: np.ndarray, bins: int = 32) -> dict:
    """{"edges", "counts"} for rollout/lengths.py: log-spaced integer edges over [1, max), and [max, max + 1)."""
    top = int(lengths.max())
    inner = np.unique(np.rint(np.geomspace(1, max(top, 2), bins + 1)).astype(np.int64))
    edges = np.append(inner[inner < top], [top, top + 1])
    counts, _ = np.histogram(np.clip(lengths, 1, None), bins=edges)  # the last bin [top, top + 1] holds the cap
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def describe(lengths: np.ndarray) -> dict:
    logs = np.log(np.clip(lengths, 1, None))
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    return {
        "n": int(len(lengths)),
        "mean": float(lengths.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": int(lengths.max()),
        "at_max": float((lengths == lengths.max()).mean()),
        "lognormal_median": float(math.exp(logs.mean())),
        "lognormal_sigma": float(logs.std()),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="the histogram JSON to write")
    p.add_argument("--bins", type=int, default=32)
    args = p.parse_args(argv)
    lengths = read_lengths(args.files)
    stats = describe(lengths)
    args.out.write_text(json.dumps({**histogram(lengths, args.bins), "stats": stats}, indent=1) + "\n")
    print(
        f"{stats['n']} responses: mean {stats['mean']:.0f}, p50 {stats['p50']:.0f}, p90 {stats['p90']:.0f}, "
        f"p99 {stats['p99']:.0f}, max {stats['max']} ({100 * stats['at_max']:.1f}% there); lognormal fit: median "
        f"{stats['lognormal_median']:.0f}, sigma {stats['lognormal_sigma']:.2f} -> {args.out}"
    )


if __name__ == "__main__":
    main()
