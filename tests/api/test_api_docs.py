"""docs/api.md's Python examples, run in order in one namespace (as a notebook would), from a
directory that looks like the repository root; the runs they write go there."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_api_doc_examples_run(tmp_path, capsys):
    for name in ("data", "configs", "hybridrl"):
        (tmp_path / name).symlink_to(ROOT / name)
    blocks = python_blocks(ROOT / "docs" / "api.md")
    assert len(blocks) == 5
    namespace: dict = {"__name__": "api_doc"}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        for i, code in enumerate(blocks):
            exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out
    # what the page says the examples print
    assert "unknown key 'actor_rollout_ref.actor.lrr'; did you mean 'actor_rollout_ref.actor.optim.lr'?" in printed
    assert "{'score': 1.0}" in printed
    result, again, scored = namespace["result"], namespace["again"], namespace["scored"]
    assert [r["step"] for r in result.history] == [0, 1, 2, 3] and "val-core/arith/reward/mean@1" in result.validation
    assert (tmp_path / namespace["hf_dir"] / "config.json").exists() and result.run_dir == tmp_path / "runs/api/quickstart"
    assert all("critic/vf_loss" in r for r in again.history)
    saved = yaml.safe_load((again.run_dir / "config.yaml").read_text())
    inputs = again.run_dir / "inputs"  # config.yaml names them as the run dir was given: relative to where it ran
    assert saved["critic"]["model"]["path"] == "runs/api/ppo/inputs/critic" and (inputs / "critic/model.safetensors").exists()
    assert saved["actor_rollout_ref"]["model"]["tokenizer_path"] == "runs/api/ppo/inputs/actor"  # from the model object
    assert (inputs / "actor" / "tokenizer_config.json").exists()
    assert scored.history[-1]["reward/errors"] == 0 and scored.history[-1]["reward/remote_latency_s"] > 0
    grpo_rows = [json.loads(x) for x in (tmp_path / "runs/api/grpo/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in grpo_rows] == [1, 2, 3]
