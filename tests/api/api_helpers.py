"""What the Python API tests share: the quickstart config as a dict and rows of its data."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def quickstart_dict() -> dict:
    """configs/quickstart.yaml as a dict, with the paths it names made absolute (tests run anywhere)."""
    cfg = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    cfg["actor_rollout_ref"]["model"]["path"] = str(ROOT / cfg["actor_rollout_ref"]["model"]["path"])
    cfg["warmup"]["files"] = str(ROOT / cfg["warmup"]["files"])
    return cfg


def rows(name: str, n: int) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "data/arith" / f"{name}.jsonl").read_text().splitlines()[:n]]
