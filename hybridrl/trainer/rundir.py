"""A run's directory: where it is (`run_dir`, `checkpoints_dir`), what it resumes from
(`find_resume`), and one run per directory: a new run never mixes its files with, or overwrites,
another run's.

A run that does not resume starts in a directory holding no run files, or stops with one line
naming the choices. `trainer.overwrite=true` moves the old run aside to `<dir>.old-<timestamp>`
(a rename: nothing is deleted). What a start that failed before its first training step left
(the config, the step-0 validation) is moved aside the same way, with a note, so the same command
runs again once the cause is fixed.

While a run trains it holds an exclusive lock on `<dir>/.lock` (`locked`): a second run started
into the same directory stops with one line naming the holder's pid, instead of both appending to
one metrics.jsonl and overwriting each other's checkpoints. The lock is `flock`, which the kernel
drops when the holder dies, so a crashed run never blocks its rerun.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

# What a run writes (hybridrl/trainer/setup.py, hybridrl/tracking/tracker.py).
RUN_FILES = ("config.yaml", "metrics.jsonl", "samples.jsonl", "checkpoints", "tensorboard", "profile")


LOCK = ".lock"


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
        aside = _move_aside(path)
        print(f"[hybridrl] {path} held a start that took no training step ({', '.join(found)}): moved it to {aside}", flush=True)
        return aside
    if not overwrite:
        raise RunDirError(
            f"{path} already holds a run ({', '.join(found)}); to continue it set trainer.resume_mode=auto, "
            "to start another give it a new trainer.experiment_name (or trainer.default_local_dir), or set "
            f"trainer.overwrite=true to move the old run aside to {path}.old-<timestamp> (nothing is deleted)"
        )
    aside = _move_aside(path)
    print(f"[hybridrl] trainer.overwrite=true: moved the previous run in {path} to {aside}", flush=True)
    return aside


def _move_aside(path: Path) -> Path:
    aside = _aside(path)
    os.replace(path, aside)
    if (aside / LOCK).exists():  # the lock is held on the file, not the name: keep it with the new run
        path.mkdir()
        os.replace(aside / LOCK, path / LOCK)
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
    from hybridrl.trainer.checkpoint import check_resumable, latest_checkpoint  # imports torch: only when asked

    if t.resume_mode != "resume_path":
        path = latest_checkpoint(checkpoints_dir(cfg))
    return check_resumable(path) if path else None


# Locks this process holds: {resolved dir: [open lock file, depth, holder thread id, its name]}. The API and the
# CLI's supervisor both take the lock in one thread (re-entered); another thread of the process is
# another run (two `hybridrl.grpo` in two threads) and is refused, as another process would be.
_held: dict[Path, list] = {}
_held_guard = threading.Lock()


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the run directory `path` exclusively (created if missing) until the block ends. The lock
    file is removed at the end (and a directory this made, if still empty), so a run leaves no trace
    of it; a holder killed with SIGKILL leaves the file, unlocked, for the next run to reuse."""
    path = Path(path)
    key = path.resolve()
    me = threading.get_ident()
    with _held_guard:
        entry = _held.get(key)
        if entry is not None and entry[2] != me:
            raise RunDirError(
                f"{path} is in use by another run in this process (thread {entry[3]!r}); wait for it to end, or give "
                "this run another trainer.experiment_name (or trainer.default_local_dir)"
            )
        if entry is not None:
            entry[1] += 1
        else:
            made = not path.exists()
            path.mkdir(parents=True, exist_ok=True)
            _held[key] = [_acquire(path), 1, me, threading.current_thread().name]
    if entry is not None:
        try:
            yield
        finally:
            entry[1] -= 1
        return
    try:
        yield
    finally:
        with _held_guard:
            f = _held.pop(key)[0]
            try:
                os.unlink(path / LOCK)  # still ours: we hold the lock, so no other run has taken the name
            except FileNotFoundError:
                pass
            f.close()  # closing the descriptor releases the lock
        if made:
            with contextlib.suppress(OSError):
                path.rmdir()  # only if empty: the run failed before writing anything


def _acquire(path: Path):
    """The open, locked lock file of `path`; RunDirError naming the holder's pid when it is taken."""
    while True:
        f = open(path / LOCK, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise RunDirError(
                f"{path} is in use by another run (pid {holder}); wait for it to end, stop it, or give this run "
                "another trainer.experiment_name (or trainer.default_local_dir)"
            ) from None
        try:  # the holder we waited on may have removed the file as it ended: lock the current one
            same = os.fstat(f.fileno()).st_ino == os.stat(path / LOCK).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f
