"""A checkpoint crafted to run code (a `.metadata` whose unpickling creates a file) is refused
by every command that loads checkpoints, with one line of error and nothing executed."""

from __future__ import annotations

import pickle
import shutil

import pytest
from cli_helpers import cli

pytestmark = pytest.mark.slow


class _CreatesFile:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _overrides(model_dir, data, out, **extra):
    empty = out.parent / "empty.yaml"
    empty.write_text("{}\n")
    o = {
        "data.train_files": data["train"],
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 4,
        "actor_rollout_ref.model.path": model_dir,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.rollout.n": 2,
        "trainer.device": "cpu",
        "trainer.total_training_steps": 1,
        "trainer.default_local_dir": out,
        "trainer.logger": "[jsonl]",
        "trainer.resume_mode": "auto",
    }
    o.update(extra)
    return [empty, *(f"{k}={v}" for k, v in o.items())]


def _assert_refused(proc, marker):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a valid checkpoint" in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists(), "the crafted checkpoint ran code"


def test_crafted_checkpoint_is_refused_everywhere(tiny_model_with_weights, arith_data, tmp_path):
    out = tmp_path / "run"
    cli("train", *_overrides(tiny_model_with_weights, arith_data, out))
    step = out / "checkpoints" / "step_1"
    marker = tmp_path / "pwned"
    (step / "actor" / "model" / ".metadata").write_bytes(pickle.dumps(_CreatesFile(marker)))
    mtime = (out / "metrics.jsonl").stat().st_mtime_ns

    other = tmp_path / "other"
    commands = {
        # auto-resume (the run asks for 2 steps, so it resumes from step_1)
        "auto-resume": ("train", *_overrides(tiny_model_with_weights, arith_data, out, **{"trainer.total_training_steps": 2})),
        # an explicit resume path, into a fresh directory
        "resume_path": (
            "train",
            *_overrides(
                tiny_model_with_weights,
                arith_data,
                other,
                **{"trainer.resume_mode": "resume_path", "trainer.resume_from_path": step, "trainer.total_training_steps": 2},
            ),
        ),
        "export": ("export", step, tmp_path / "hf"),
        "eval": ("eval", "--model", out, "--data", arith_data["test"], "--max-response-length", 4),
    }
    for name, args in commands.items():
        proc = cli(*args, check=False)
        assert proc.returncode == 2, (name, proc.stderr)
        _assert_refused(proc, marker)
    assert (out / "metrics.jsonl").stat().st_mtime_ns == mtime, "a refused resume must leave the run as it was"
    shutil.rmtree(tmp_path / "hf", ignore_errors=True)
