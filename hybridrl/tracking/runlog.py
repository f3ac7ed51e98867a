"""Reading what a run wrote: `metrics.jsonl`, `samples.jsonl`, the rollout / validation dumps.

The files are append-only JSONL written while the run trains, so a reader can meet a last line
that is still being written (or was cut by a crash). `read_jsonl` keeps every complete line and
reports the partial one instead of failing; the report and the dashboard show that notice.

A run folder may hold anything under these names (the dashboard serves every folder under its
root): only regular files are read, opened without blocking (a FIFO named metrics.jsonl would wait
for a writer for ever), and at most `MAX_JSONL_BYTES` of a JSONL file (its last part, with a
notice) and `MAX_CONFIG_BYTES` of a config (a link to /dev/zero reads nothing, never until memory
runs out).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

METRICS, SAMPLES, CONFIG = "metrics.jsonl", "samples.jsonl", "config.yaml"
SKIP_PREFIXES = (".tmp", ".trash")  # a checkpoint being written, or being deleted (trainer/checkpoint.py)
MAX_JSONL_BYTES = 256 << 20  # ~1M steps of 40 metrics; a longer file is read from its last part
MAX_CONFIG_BYTES = 4 << 20  # a resolved config is ~10 KB


class RunError(ValueError):
    """A run directory whose files cannot be read as a run (one line: which file, what is wrong)."""


def read_capped(path: Path, limit: int) -> tuple[bytes, int]:
    """(at most the last `limit` bytes of the regular file `path`, its size). Opened without
    blocking and checked on the open descriptor: RunError for a FIFO, a device, a socket or a
    directory; FileNotFoundError when it is absent."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a device or socket"
            raise RunError(f"{path}: is {kind}, not a regular file; a run writes it as a file")
        if st.st_size > limit:
            os.lseek(fd, st.st_size - limit, os.SEEK_SET)
        chunks, left = [], min(st.st_size, limit)
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), st.st_size
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """(the objects of every complete line, notices about lines skipped).

    A last line without its newline is a write in progress or a crash mid-write: skipped and
    reported. A malformed line elsewhere is reported with its line number and skipped too. A file
    over MAX_JSONL_BYTES is read from its last MAX_JSONL_BYTES (the first, cut line dropped), and
    says so; anything but a regular file is RunError.
    """
    try:
        raw, size = read_capped(path, MAX_JSONL_BYTES + 1)  # + the byte before: does the window start a line?
    except FileNotFoundError:
        return [], []
    notes, rows = [], []
    if size > len(raw):
        raw = raw[raw.find(b"\n") + 1 :]  # the cut line's rest (nothing when the window starts a line)
        notes.append(f"{path}: {size >> 20} MiB, over the {MAX_JSONL_BYTES >> 20} MiB read: only its last lines are shown")
    lines = raw.decode(errors="replace").split("\n")
    if lines and lines[-1] != "":
        notes.append(f"{path}: skipped a partial last line ({len(lines[-1])} bytes, still being written or cut by a crash)")
    for i, line in enumerate(lines[:-1], 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            notes.append(f"{path}, line {i}: skipped, not JSON ({e.msg})")
            continue
        except RecursionError:  # e.g. "[[[[..." thousands deep: not a metrics line either
            notes.append(f"{path}, line {i}: skipped, nested too deep to be a metrics line")
            continue
        except ValueError as e:  # an integer of more digits than Python converts
            notes.append(f"{path}, line {i}: skipped ({e})")
            continue
        if isinstance(obj, dict):
            rows.append(obj)
    return rows, notes


@dataclass
class RunData:
    """One run directory, read."""

    name: str
    path: Path
    config: dict = field(default_factory=dict)
    metrics: list[dict] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)  # prompt groups, see tracking/samples.py
    notes: list[str] = field(default_factory=list)
    mtime: float = 0.0
    error: str | None = None  # why this run could not be read (then it has no metrics); shown, never raised

    @property
    def last_step(self) -> int:
        return max((int(r.get("step", 0)) for r in self.metrics), default=0)


def find_runs(root: Path) -> list[Path]:
    """Every run directory at or under `root` (a directory holding metrics.jsonl), sorted.

    Checkpoints are written to temporary directories and renamed, so directories appear and vanish
    while this walks: one that is gone by the time it is listed is skipped, never an error. A run's
    `checkpoints/` folder holds no runs and is not walked (it is most of the tree), nor are the
    checkpoint writer's `.tmp_step_N` / `.trash_step_N` directories anywhere.
    """
    root = Path(root)
    found, stack = [], [str(root)]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue  # vanished (a checkpoint's temporary directory), or not ours to read
        names = {e.name for e in entries}
        is_run = METRICS in names
        if is_run:
            found.append(Path(folder))
        for e in entries:
            if e.name.startswith(SKIP_PREFIXES) or (is_run and e.name == "checkpoints"):
                continue
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
            except OSError:
                continue
    return sorted(found)


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read a run directory, or a bare metrics JSONL file (e.g. a GSM8K run's *.metrics.jsonl)."""
    path = Path(path)
    if path.is_file():
        metrics, notes = read_jsonl(path)
        stem = path.name.removesuffix(".jsonl").removesuffix(".metrics")
        return RunData(name or stem, path, {}, _numeric(metrics), [], notes, path.stat().st_mtime)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a run directory (one with metrics.jsonl) nor a metrics .jsonl file")
    if not (path / METRICS).exists():
        raise FileNotFoundError(f"{path} has no {METRICS}: give a run directory (runs/<project>/<experiment>)")
    config = read_config(path / CONFIG)
    metrics, notes = read_jsonl(path / METRICS)
    samples, sample_notes = read_samples(path, config)
    mtime = max((p.stat().st_mtime for p in (path / METRICS, path / SAMPLES) if p.exists()), default=0.0)
    return RunData(name or path.name, path, config, _numeric(metrics), samples, notes + sample_notes, mtime)


def load_run_or_error(path: Path, name: str) -> RunData | None:
    """`load_run` for a reader of many runs: a run that cannot be read comes back with `error` set
    (so one bad directory never hides the others), and None when the directory vanished."""
    try:
        return load_run(path, name=name)
    except FileNotFoundError:
        return None
    except (RunError, OSError, ValueError, TypeError, AttributeError, RecursionError) as e:
        reason = str(e) if isinstance(e, RunError) else f"{type(e).__name__}: {e}"
        return RunData(name, Path(path), error=reason)


def read_config(path: Path) -> dict:
    """A run's resolved config.yaml as a mapping ({} when absent); RunError when it is not one."""
    try:
        raw, size = read_capped(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return {}
    if size > len(raw):
        raise RunError(f"{path}: {size >> 20} MiB, not a run's config (a resolved config is a few KB)")
    text = raw.decode(errors="replace")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise RunError(f"{path}: not valid YAML{at} ({problem}); truncated by a crash or a full disk?") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise RunError(f"{path}: holds a {type(config).__name__}, not the mapping of a resolved config")
    return config


def read_samples(path: Path, config: dict) -> tuple[list[dict], list[str]]:
    """Prompt groups from samples.jsonl, plus the verl-style dumps of trainer.rollout_data_dir and
    trainer.validation_data_dir when those directories exist (steps samples.jsonl lacks)."""
    from hybridrl.tracking.samples import group_dump_rows, normalize_group

    rows, notes = read_jsonl(path / SAMPLES)
    groups = []
    for i, r in enumerate(rows, 1):
        try:
            groups.append(normalize_group(r))
        except (TypeError, ValueError, AttributeError) as e:
            notes.append(f"{path / SAMPLES}: skipped prompt group {i}, not in the samples format ({e})")
    have = {(g["kind"], g["step"]) for g in groups}
    trainer = config.get("trainer") if isinstance(config, dict) else None
    trainer = trainer if isinstance(trainer, dict) else {}
    for key, kind in (("rollout_data_dir", "train"), ("validation_data_dir", "val")):
        folder = trainer.get(key)
        if not folder:
            continue
        # A relative dump directory is relative to where the run was launched: try there, then the run dir.
        folder = next((c for c in (Path(folder), path / folder) if c.is_dir()), None)
        if folder is None:
            continue
        for f in sorted(folder.glob("*.jsonl"), key=_step_of_file):
            dump, dump_notes = read_jsonl(f)
            notes += dump_notes
            for g in group_dump_rows(dump, kind):
                if (g["kind"], g["step"]) not in have:
                    groups.append(g)
    groups.sort(key=lambda g: (g["step"], g["kind"] != "train"))
    return groups, notes


def _step_of_file(p: Path) -> int:
    return int(p.stem) if p.stem.isdigit() else 0


def _numeric(rows: list[dict]) -> list[dict]:
    """Metric rows with only finite numbers (JsonlLogger writes NaN/inf as strings; an int past
    the float range is dropped like inf). Exact type checks: this loop is most of a cold scan."""
    out = []
    isfinite, big = math.isfinite, sys.float_info.max
    for r in rows:
        clean = {}
        for k, v in r.items():
            t = type(v)
            if t is float:
                if isfinite(v):
                    clean[k] = v
            elif t is int:
                if -big <= v <= big:
                    clean[k] = v
            elif t is bool:
                clean[k] = float(v)
        if "step" in clean:
            out.append(clean)
    return out
