"""Reading what a run wrote: `metrics.jsonl`, `samples.jsonl`, the rollout / validation dumps.

The files are append-only JSONL written while the run trains, so a reader can meet a last line
that is still being written (or was cut by a crash). `read_jsonl` keeps every complete line and
reports the partial one instead of failing; the report and the dashboard show that notice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

METRICS, SAMPLES, CONFIG = "metrics.jsonl", "samples.jsonl", "config.yaml"


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """(the objects of every complete line, notices about lines skipped).

    A last line without its newline is a write in progress or a crash mid-write: skipped and
    reported. A malformed line elsewhere is reported with its line number and skipped too.
    """
    if not path.exists():
        return [], []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    notes, rows = [], []
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

    @property
    def last_step(self) -> int:
        return max((int(r.get("step", 0)) for r in self.metrics), default=0)


def find_runs(root: Path) -> list[Path]:
    """Every run directory at or under `root` (a directory holding metrics.jsonl), sorted."""
    root = Path(root)
    found = {p.parent for p in root.rglob(METRICS)} if root.is_dir() else set()
    if (root / METRICS).exists():
        found.add(root)
    return sorted(found)


def load_run(path: Path, name: str | None = None) -> RunData:
    """Read a run directory, or a bare metrics JSONL file (e.g. benchmarks/results/*.metrics.jsonl)."""
    path = Path(path)
    if path.is_file():
        metrics, notes = read_jsonl(path)
        stem = path.name.removesuffix(".jsonl").removesuffix(".metrics")
        return RunData(name or stem, path, {}, _numeric(metrics), [], notes, path.stat().st_mtime)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a run directory (one with metrics.jsonl) nor a metrics .jsonl file")
    if not (path / METRICS).exists():
        raise FileNotFoundError(f"{path} has no {METRICS}: give a run directory (runs/<project>/<experiment>)")
    config = {}
    if (path / CONFIG).exists():
        config = yaml.safe_load((path / CONFIG).read_text()) or {}
    metrics, notes = read_jsonl(path / METRICS)
    samples, sample_notes = read_samples(path, config)
    mtime = max((p.stat().st_mtime for p in (path / METRICS, path / SAMPLES) if p.exists()), default=0.0)
    return RunData(name or path.name, path, config, _numeric(metrics), samples, notes + sample_notes, mtime)


def read_samples(path: Path, config: dict) -> tuple[list[dict], list[str]]:
    """Prompt groups from samples.jsonl, plus the verl-style dumps of trainer.rollout_data_dir and
    trainer.validation_data_dir when those directories exist (steps samples.jsonl lacks)."""
    from hybridrl.tracking.samples import group_dump_rows, normalize_group

    rows, notes = read_jsonl(path / SAMPLES)
    groups = [normalize_group(r) for r in rows]
    have = {(g["kind"], g["step"]) for g in groups}
    trainer = config.get("trainer", {}) if isinstance(config, dict) else {}
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
    """Metric rows with only finite numbers (JsonlLogger writes NaN/inf as strings)."""
    out = []
    for r in rows:
        clean = {}
        for k, v in r.items():
            if isinstance(v, bool):
                v = float(v)
            if isinstance(v, (int, float)) and math.isfinite(v):
                clean[k] = v
        if "step" in clean:
            out.append(clean)
    return out
