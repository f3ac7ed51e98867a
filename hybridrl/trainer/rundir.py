"""A run's directory: where it is (`run_dir`, `checkpoints_dir`), what it resumes from
(`find_resume`), and one run per directory: a new run never mixes its files with, or overwrites,
another run's.

A run that does not resume starts in a directory holding no run files, or stops with one line
naming the choices. `trainer.overwrite=true` moves the old run aside to `<dir>.old-<timestamp>`
(a rename: nothing is deleted).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# What a run writes (hybridrl/trainer/setup.py, hybridrl/tracking/tracker.py).
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "checkpoints", "tensorboard", "profile")


class RunDirError(FileExistsError):
    """A new run was pointed at a directory that holds another run."""


def run_files(path: Path) -> list[str]:
    return [name for name in RUN_FILES if (path / name).exists()]


def claim(path: Path, overwrite: bool) -> Path | None:
    """Make `path` ready for a new run. Returns where an old run was moved, or None."""
    found = run_files(path)
    if not found:
        return None
    if not overwrite:
        raise RunDirError(
            f"{path} already holds a run ({', '.join(found)}); to continue it set trainer.resume_mode=auto, "
            "to start another give it a new trainer.experiment_name (or trainer.default_local_dir), or set "
            f"trainer.overwrite=true to move the old run aside to {path}.old-<timestamp> (nothing is deleted)"
        )
    aside = path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        n += 1
    os.replace(path, aside)
    print(f"[hybridrl] trainer.overwrite=true: moved the previous run in {path} to {aside}", flush=True)
    return aside


def run_dir(cfg) -> Path:
    """trainer.default_local_dir, or runs/<project_name>/<experiment_name>."""
    t = cfg.trainer
    return Path(t.default_local_dir or f"runs/{t.project_name}/{t.experiment_name}")


def checkpoints_dir(cfg) -> Path:
    """A run's `checkpoints/` (step_N/ directories and `latest`): where saves go and resume looks."""
    return run_dir(cfg) / "checkpoints"


def find_resume(cfg) -> Path | None:
    """The checkpoint a run continues from (trainer.resume_mode), or None for a fresh start."""
    t = cfg.trainer
    if t.resume_mode == "disable":
        return None
    if t.resume_mode == "resume_path":
        path = Path(t.resume_from_path)
        if not (path / "trainer_state.json").exists():
            raise FileNotFoundError(f"trainer.resume_from_path={path} is not a complete checkpoint (no trainer_state.json)")
        return path
    from hybridrl.trainer.checkpoint import latest_checkpoint  # imports torch: only when asked

    return latest_checkpoint(checkpoints_dir(cfg))
