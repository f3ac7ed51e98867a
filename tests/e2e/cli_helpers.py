"""Helpers shared by the end-to-end CLI tests: run `python -m hybridrl`, read what a run wrote."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

VOLATILE = (
    "timing_s/",
    "perf/throughput",
    "perf/samples_per_s",
    "perf/rollout_tokens_per_s",
    "rollout/decode_ms_per_step",
    "agent/tool_wait_share",
    "rollout/extend_",  # wall-clock, and how answers arrive (which ones rejoin together)
    "agent/tool_latency_s",
    "rollout/graph_capture_s",
)  # wall-clock numbers differ between runs


def cli(*args, env=None, check=True, cwd=None):
    proc = subprocess.run(
        [sys.executable, "-m", "hybridrl", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=900,
        cwd=cwd,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def weights(path) -> dict[str, torch.Tensor]:
    """The weights of an HF directory, or of a sharded checkpoint's role directory (exported)."""
    from hybridrl.distributed.checkpoint import export_hf, is_sharded_checkpoint

    if is_sharded_checkpoint(path):
        with tempfile.TemporaryDirectory() as tmp:
            return load_file(str(export_hf(path, tmp) / "model.safetensors"))
    return load_file(str(Path(path) / "model.safetensors"))


def assert_all_finite(rows) -> None:
    for row in rows:
        for k, v in row.items():
            assert isinstance(v, (int, float)) and math.isfinite(v), (row.get("step"), k, v)


def without_volatile(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}
