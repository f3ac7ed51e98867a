"""Short runs of the shipped configs whose metrics must stay exactly as stored (tests/e2e/golden/).

They pin every trainer's numbers through refactors of the workers and the loop: PPO with a learned
critic (GAE, KL in the reward, validation), DPO, KTO (its KL reference point) and SFT, each a few
steps after a few warm-up steps (the quickstart's golden run is in test_quickstart.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli, metrics
from golden_metrics import GOLDEN_ENV, assert_matches_golden

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHORT = {"trainer.logger": "[jsonl]", "trainer.save_freq": -1, "trainer.total_training_steps": 3}
WARMUP = {"warmup.steps": 4, "warmup.batch_size": 16}
RUNS = {
    "arith_ppo": ("configs/arith_ppo.yaml", {**WARMUP, "trainer.test_freq": 2, "data.val_max_samples": 32}),
    "dpo": ("configs/dpo.yaml", WARMUP),
    "kto": ("configs/kto.yaml", WARMUP),
    "sft": ("configs/sft.yaml", {}),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_short_run_matches_golden_metrics(name, tmp_path):
    config, overrides = RUNS[name]
    args = {**SHORT, **overrides, "trainer.default_local_dir": tmp_path}
    cli("train", config, *[f"{k}={v}" for k, v in args.items()], env=GOLDEN_ENV, cwd=ROOT)
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows][-1] == 3
    assert_matches_golden(name, rows)
