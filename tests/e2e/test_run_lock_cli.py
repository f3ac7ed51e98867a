"""Two `hybridrl train` into one directory at once: the second stops at start naming the first's pid,
the first's metrics and checkpoints are its own; once the first is killed (SIGKILL: no cleanup), the
same command resumes it and the run's steps are logged once each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import cli

pytestmark = pytest.mark.slow


def test_a_second_run_into_a_running_run_is_refused_and_the_killed_one_resumes(tiny_model_with_weights, arith_data, tmp_path):
    out = tmp_path / "run"
    (tmp_path / "empty.yaml").write_text("{}\n")
    args = [
        str(tmp_path / "empty.yaml"),
        f"data.train_files={arith_data['train']}",
        "data.train_batch_size=4",
        "data.max_prompt_length=8",
        "data.max_response_length=4",
        f"actor_rollout_ref.model.path={tiny_model_with_weights}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "trainer.device=cpu",
        "trainer.total_training_steps=400",
        "trainer.save_freq=1",
        "trainer.max_ckpt_to_keep=2",
        f"trainer.default_local_dir={out}",
        "trainer.logger=[jsonl]",
    ]
    first = subprocess.Popen(
        [sys.executable, "-m", "hybridrl", "train", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "latest").exists():  # it holds the lock and has saved a step
            assert first.poll() is None and time.monotonic() < deadline, (
                first.stderr.read() if first.poll() is not None else "slow"
            )
            time.sleep(0.2)
        second = cli("train", *args, check=False)
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"is in use by another run (pid {first.pid})" in lines[0], second.stderr
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    # the killed run left its lock file, unlocked: the same command resumes from its latest checkpoint
    last = int((out / "checkpoints" / "latest").read_text().removeprefix("step_"))
    more = [a for a in args if "total_training_steps" not in a] + [f"trainer.total_training_steps={last + 2}"]
    resumed = cli("train", *more)
    assert f"at step {last}/{last + 2}" in resumed.stdout, resumed.stdout
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert sorted(steps) == sorted(set(steps)) and max(steps) == last + 2, steps  # every step logged once
