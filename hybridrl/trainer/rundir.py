"""One run per directory: a new run never mixes its files with, or overwrites, another run's.

A run that does not resume starts in a directory holding no run files, or stops with one line
naming the choices. `trainer.overwrite=true` moves the old run aside to `<dir>.old-<timestamp>`
(a rename: nothing is deleted). What a start that failed before its first training step left
(the config, the step-0 validation) is moved aside the same way, with a note, so the same command
runs again once the cause is fixed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# What a run writes (hybridrl/trainer/setup.py, hybridrl/tracking/tracker.py).
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "checkpoints", "tensorboard", "profile")


class RunDirError(FileExistsError):
    """A new run was pointed at a directory that holds another run."""


def _aside(path: Path) -> Path:
    aside = path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        n += 1
    return aside


def _took_no_step(path: Path) -> bool:
    """No checkpoint and no metrics line of a training step (step >= 1); unreadable lines count as steps."""
    ckpts = path / "checkpoints"
    if ckpts.exists() and any(ckpts.iterdir()):
        return False
    metrics = path / "metrics.jsonl"
    if not metrics.exists():
        return True
    for line in metrics.read_text(errors="replace").splitlines():
        try:
            if line.strip() and json.loads(line).get("step", 1) >= 1:
                return False
        except (ValueError, AttributeError):
            return False
    return True


def run_files(path: Path) -> list[str]:
    return [name for name in RUN_FILES if (path / name).exists()]


def claim(path: Path, overwrite: bool) -> Path | None:
    """Make `path` ready for a new run. Returns where an old run was moved, or None."""
    found = run_files(path)
    if not found:
        return None
    if not overwrite and _took_no_step(path):
        aside = _aside(path)
        os.replace(path, aside)
        print(f"[hybridrl] {path} held a start that took no training step ({', '.join(found)}): moved it to {aside}", flush=True)
        return aside
    if not overwrite:
        raise RunDirError(
            f"{path} already holds a run ({', '.join(found)}); to continue it set trainer.resume_mode=auto, "
            "to start another give it a new trainer.experiment_name (or trainer.default_local_dir), or set "
            f"trainer.overwrite=true to move the old run aside to {path}.old-<timestamp> (nothing is deleted)"
        )
    aside = _aside(path)
    os.replace(path, aside)
    print(f"[hybridrl] trainer.overwrite=true: moved the previous run in {path} to {aside}", flush=True)
    return aside
