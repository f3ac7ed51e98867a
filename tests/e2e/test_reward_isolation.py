"""A reward function that hangs, exits or kills its process costs samples, never the run: a short
quickstart finishes with the failures counted in reward/errors and reward/timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli, metrics

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# Each failure happens once per split (a marker file records it), so the run stays short: once
# in the validation before training (split "test"), once in training step 1 (split "train").
REWARD = """
import os, sys, time

def _once(tag, split):
    mark = {mark!r} + "." + tag + "." + split
    if os.path.exists(mark):
        return False
    open(mark, "w").close()
    return True

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    split = extra_info["split"]
    if _once("hang", split):
        time.sleep(600)
    if _once("os_exit", split):
        os._exit(1)
    if _once("sys_exit", split):
        sys.exit("bye")
    if _once("interrupt", split):
        raise KeyboardInterrupt
    return float(solution_str.strip() == str(ground_truth))
"""


def test_hanging_and_exiting_reward_functions_finish_a_quickstart_run(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD.format(mark=str(tmp_path / "mark")))
    out = tmp_path / "run"
    proc = cli(
        "train",
        "configs/quickstart.yaml",
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=2",
        "warmup.steps=0",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.timeout_s=2",
        "custom_reward_function.num_workers=1",
        "trainer.logger=[console,jsonl]",
        cwd=REPO,
    )
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    # validation counts them too: hang, os._exit, sys.exit, KeyboardInterrupt
    assert rows[0]["val-aux/reward/errors"] == 4 and rows[0]["val-aux/reward/timeouts"] == 1
    assert [r["reward/errors"] for r in rows[1:]] == [4, 0] and [r["reward/timeouts"] for r in rows[1:]] == [1, 0]
    # the console line names the counts as metrics.jsonl does, only when they are not 0
    assert "reward/errors 4 | reward/timeouts 1" in proc.stdout and "step 2/2" in proc.stdout
