"""docs/coming_from_trl.md: its hybridrl script trains on the first try (always), its TRL script too where
trl is installed. Both run as written, with a tiny local model in place of the Hub id and 2 steps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/coming_from_trl.md"


def _scripts() -> tuple[str, str]:
    trl, ours = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)[:2]
    assert "from trl import" in trl and "import hybridrl" in ours
    return trl, ours


def _run(script: str, model: str, cwd: Path) -> subprocess.CompletedProcess:
    hub_id = '"Qwen/Qwen2.5-0.5B-Instruct"'
    assert hub_id in script and "max_steps=20" in script
    script = script.replace(hub_id, repr(model)).replace("max_steps=20", "max_steps=2")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_hybridrl_script_trains_on_the_first_try(tiny_model_with_weights, tmp_path):
    _, ours = _scripts()
    proc = _run(ours, tiny_model_with_weights, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run = tmp_path / "runs/hybridrl_grpo"
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in history] == [1, 2]
    for r in history:  # the weighted sum of the two functions (1.0 x correct + 0.5 x brief), mean over the batch
        assert r["critic/score/mean"] == pytest.approx(r["reward/correct/mean"] + 0.5 * r["reward/brief/mean"], abs=1e-5)
        assert r["reward/brief/mean"] < 0 and r["reward/errors"] == 0
    config = json.dumps(__import__("yaml").safe_load((run / "config.yaml").read_text()))
    assert '"kl_loss_coef": 0.04' in config and '"n": 4' in config and '"train_batch_size": 4' in config
    assert (run / "final/config.json").exists()


def test_the_trl_script_runs_where_trl_is_installed(tiny_model_with_weights, tmp_path):
    pytest.importorskip("trl", reason="trl is not installed: only the hybridrl side runs")
    trl, _ = _scripts()
    proc = _run(trl, tiny_model_with_weights, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "runs/trl_grpo/final/config.json").exists()
