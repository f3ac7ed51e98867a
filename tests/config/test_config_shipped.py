"""Every YAML shipped in configs/ loads and validates."""

from pathlib import Path

import pytest

from hybridrl.config import load_config, plan_batches

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.skipif(not CONFIGS, reason="no configs/*.yaml shipped yet")
@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_loads(path):
    cfg = load_config(path)  # raises ConfigError listing every problem
    assert plan_batches(cfg).actor.grad_accum >= 1
