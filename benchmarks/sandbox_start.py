"""The code sandbox's start cost: milliseconds per snippet (`print(1)`), one at a time.

With `--baseline PATH` (an older sandbox: the `hybridrl/sandbox` folder of an older checkout, e.g.
`git archive REV hybridrl/sandbox | tar -x -C /tmp/old`, or, before it became a package, one file:
`git show REV:hybridrl/rollout/agent/sandbox.py > old.py`) both run alternately in one process, so
that the machine's load falls on both alike. A line per
sandbox on stdout: the median and the minimum of `--runs` runs; `--out FILE` also writes them as JSON.

    python benchmarks/sandbox_start.py --runs 40
    python benchmarks/sandbox_start.py --runs 40 --baseline /tmp/old/hybridrl/sandbox
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import time

from hybridrl import sandbox as current


def load(path: str):
    """The sandbox at `path`: a package folder (its __init__.py) or a single module file."""
    if os.path.isdir(path):
        init = os.path.join(path, "__init__.py")
        spec = importlib.util.spec_from_file_location("baseline_sandbox", init, submodule_search_locations=[path])
    else:
        spec = importlib.util.spec_from_file_location("baseline_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_sandbox"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def measure(sandboxes: dict, runs: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {name: [] for name in sandboxes}
    for _ in range(runs):
        for name, sandbox in sandboxes.items():
            start = time.perf_counter()
            result = await sandbox.run("print(1)")
            seconds[name].append(time.perf_counter() - start)
            if result.stdout != "1\n":
                raise SystemExit(f"{name}: the snippet failed: {result.stderr.strip()[-300:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--baseline", help="an older sandbox (its package folder, or sandbox.py) to run alternately")
    parser.add_argument("--out", help="write the numbers as JSON here")
    args = parser.parse_args()
    modules = {"current": current} | ({"baseline": load(args.baseline)} if args.baseline else {})
    sandboxes = {name: m.LocalSandbox(m.SandboxConfig(max_concurrency=1)) for name, m in modules.items()}
    seconds = asyncio.run(measure(sandboxes, args.runs))
    report = {
        name: {"median_ms": 1000 * statistics.median(s), "min_ms": 1000 * min(s), "runs": len(s)} for name, s in seconds.items()
    }
    for name, r in report.items():
        print(f"{name}: median {r['median_ms']:.0f} ms, min {r['min_ms']:.0f} ms over {r['runs']} runs")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
