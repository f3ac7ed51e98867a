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
import stat
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


# The first line `save_config` writes (hybridrl/config/loader.py): what marks a run's config.yaml.
CONFIG_HEADER = "# hybridrl config"
_STEP_DIRS = ("step_", ".tmp_step_", ".trash_step_", "latest")


def _regular(path: Path) -> bool:
    """A regular file (after links): never a FIFO, a device or a directory, which a read could hang on."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _metrics_lines(path: Path) -> Iterator[str]:
    """The lines of a regular metrics.jsonl (none for anything else), read as they are needed."""
    if not _regular(path):
        return
    with open(path, errors="replace") as f:
        yield from f


def is_run(path: Path) -> bool:
    """Whether the run files in `path` were written by hybridrl: its config.yaml starts with the
    header hybridrl writes; without one (a start that crashed before saving it), metrics.jsonl holds
    only JSON objects with a step and checkpoints/ only step directories."""
    config = path / "config.yaml"
    if config.exists() or config.is_symlink():
        if not _regular(config):
            return False
        with open(config, "rb") as f:
            return f.read(len(CONFIG_HEADER)).decode(errors="replace") == CONFIG_HEADER
    metrics, ckpts = path / "metrics.jsonl", path / "checkpoints"
    if not (metrics.exists() or ckpts.exists()):
        return False
    if metrics.exists() or metrics.is_symlink():
        if not _regular(metrics):
            return False
        for n, line in enumerate(_metrics_lines(metrics)):
            if n >= 100:  # the first lines tell
                break
            try:
                if line.strip() and "step" not in json.loads(line):
                    return False
            except (ValueError, TypeError):
                return n > 0  # a partial last line (a kill mid-write) after lines of ours
    if ckpts.exists() and (not ckpts.is_dir() or any(not c.name.startswith(_STEP_DIRS) for c in ckpts.iterdir())):
        return False
    return True


def _took_no_step(path: Path) -> bool:
    """No checkpoint and no metrics line of a training step (step >= 1); unreadable lines count as steps."""
    ckpts = path / "checkpoints"
    if ckpts.exists() and any(ckpts.iterdir()):
        return False
    for line in _metrics_lines(path / "metrics.jsonl"):
        try:
            if line.strip() and json.loads(line).get("step", 1) >= 1:
                return False
        except (ValueError, AttributeError):
            return False
    return True


def run_files(path: Path) -> list[str]:
    return [name for name in RUN_FILES if (path / name).exists() or (path / name).is_symlink()]


def claim(path: Path, overwrite: bool) -> Path | None:
    """Make `path` ready for a new run. Returns where an old run was moved, or None. Only a
    directory hybridrl wrote is ever moved; one holding another program's files is refused."""
    found = run_files(path)
    if not found:
        return None
    if not is_run(path):
        raise RunDirError(
            f"{path} holds {', '.join(found)} that hybridrl did not write (not a hybridrl run): it is left as it is; "
            "give the run a directory of its own with trainer.default_local_dir (or trainer.experiment_name)"
        )
    if not overwrite and _took_no_step(path):
        aside = _move_aside(path)
        print(f"[hybridrl] {path} held a start that took no training step ({', '.join(found)}): moved it to {aside}", flush=True)
        return aside
    if not overwrite:
        raise RunDirError(
            f"{path} already holds a run ({', '.join(found)}); to continue it set trainer.resume_mode=auto, "
            "to start another give it a new trainer.experiment_name (or trainer.default_local_dir), or set "
            f"trainer.overwrite=true to move the old run aside to {os.path.abspath(path)}.old-<timestamp> (nothing is deleted)"
        )
    aside = _move_aside(path)
    print(f"[hybridrl] trainer.overwrite=true: moved the previous run in {path} to {aside}", flush=True)
    return aside


def _move_aside(path: Path) -> Path:
    full = Path(os.path.abspath(path))  # `.` has no name to rename; a link stays a link (not resolved)
    if Path.cwd().resolve().is_relative_to(full.resolve()):
        raise RunDirError(
            f"{path} holds a run to move aside, but it is the current directory (or holds it): run from another "
            "directory, or give the new run another trainer.default_local_dir"
        )
    aside = _aside(full)
    os.replace(full, aside)
    if (aside / LOCK).exists():  # the lock is held on the file, not the name: keep it with the new run
        full.mkdir()
        os.replace(aside / LOCK, full / LOCK)
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


# Locks this process holds: {resolved dir: [open lock file, depth, holder thread id, its name]}. The
# API and the CLI's supervisor both take the lock in one thread (re-entered); another thread of the
# process is another run (two `hybridrl.grpo` in two threads) and is refused, as another process is.
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
