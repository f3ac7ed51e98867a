"""Stored metrics of reference runs: a refactor must reproduce every deterministic number exactly.

A golden file is JSON lines: a header `{"golden": {...}}` naming where it was made (torch version,
CPU architecture and vector ISA, intra-op threads), then one row per logged step with the
deterministic metrics only (wall-clock numbers dropped). `assert_matches_golden` checks that the
run logged the stored steps and no other, and that each step holds exactly the stored keys with the
stored values: a metric the run adds (a new key) fails as a dropped one does, so every metric is
pinned from the day it appears (regenerate to take it in). On another CPU ISA or torch build the
kernels may round differently, so the comparison falls back to a relative tolerance of 1e-6 and
says so. tests/conftest.py pins torch's AVX2 kernels on x86-64 (ATEN_CPU_CAPABILITY=avx2, unless
set), the ones the stored files were made with, so an AVX-512 machine compares exactly too.

Regenerate (only on purpose, on the commit whose numbers are the reference):
    HYBRIDRL_UPDATE_GOLDEN=1 python -m pytest tests/e2e/test_quickstart.py tests/e2e/test_golden_metrics.py
"""

from __future__ import annotations

import json
import math
import os
import platform
from pathlib import Path

import torch
from cli_helpers import VOLATILE

GOLDEN_DIR = Path(__file__).parent / "golden"
# Golden runs pin the intra-op thread count: CPU reductions split over threads round differently.
THREADS = "1"
GOLDEN_ENV = {"OMP_NUM_THREADS": THREADS}
_WALL_CLOCK_PREFIXES = (*VOLATILE, "perf/mfu", "perf/max_memory")
REL_TOL_OTHER_PLATFORM = 1e-6


def deterministic(row: dict) -> dict:
    """The row without numbers derived from wall-clock time (or device memory)."""
    return {
        k: v
        for k, v in row.items()
        if not k.startswith(_WALL_CLOCK_PREFIXES) and not k.endswith("_per_s") and "_ms_per_" not in k
    }


def platform_header() -> dict:
    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "omp_num_threads": THREADS,
    }


def _same_kernels(a: dict, b: dict) -> bool:
    """Same CPU architecture, vector ISA and torch release (a +cpu and a CUDA wheel share CPU kernels)."""

    def key(h: dict) -> tuple:
        return h["machine"], h["cpu_capability"], h["torch"].split("+")[0]

    return key(a) == key(b)


def update_requested() -> bool:
    return os.environ.get("HYBRIDRL_UPDATE_GOLDEN") == "1"


def write_golden(name: str, rows: list[dict]) -> Path:
    path = GOLDEN_DIR / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"golden": platform_header()}] + [deterministic(r) for r in rows]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def assert_matches_golden(name: str, rows: list[dict]) -> None:
    """Every key of every stored step is in `rows` and equal (exactly, on the recorded platform)."""
    if update_requested():
        write_golden(name, rows)
    path = GOLDEN_DIR / f"{name}.jsonl"
    header, *golden = [json.loads(x) for x in path.read_text().splitlines()]
    recorded, here = header["golden"], platform_header()
    exact = _same_kernels(recorded, here)
    how = (
        "exactly"
        if exact
        else f"with rel tol {REL_TOL_OTHER_PLATFORM} (golden made on {recorded}, this is {here}: kernels may round differently)"
    )
    by_step = {r["step"]: deterministic(r) for r in rows}
    missing_steps = [g["step"] for g in golden if g["step"] not in by_step]
    assert not missing_steps, f"{path.name}: steps {missing_steps} not logged (compared {how})"
    extra_steps = sorted(set(by_step) - {g["step"] for g in golden})
    assert not extra_steps, f"{path.name}: steps {extra_steps} logged but not stored (compared {how})"
    diffs = []
    for g in golden:
        row = by_step[g["step"]]
        for key in sorted(set(row) - set(g)):
            diffs.append(f"step {g['step']} {key}: not in the golden file, now {row[key]!r} (a new metric)")
        for key, want in g.items():
            got = row.get(key, "<missing>")
            same = got == want or (
                not exact
                and isinstance(got, (int, float))
                and isinstance(want, (int, float))
                and math.isclose(got, want, rel_tol=REL_TOL_OTHER_PLATFORM)
            )
            if not same:
                diffs.append(f"step {g['step']} {key}: golden {want!r}, now {got!r}")
    assert not diffs, (
        f"{path.name}: {len(diffs)} metric(s) differ from the stored run (compared {how}); first ones:\n"
        + "\n".join(diffs[:20])
        + "\nIf the change is meant to alter these numbers, regenerate with HYBRIDRL_UPDATE_GOLDEN=1 and say why in the commit."
    )
