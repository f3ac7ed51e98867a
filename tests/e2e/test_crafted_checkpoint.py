"""A checkpoint crafted to run code (a `.metadata` whose unpickling creates a file) is refused
by every command that loads checkpoints, with one line of error and nothing executed."""

from __future__ import annotations

import pickle
import shutil

import pytest
from cli_helpers import cli, one_step_args

pytestmark = pytest.mark.slow


class _CreatesFile:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _overrides(model_dir, data, out, **extra):
    return one_step_args(model_dir, data["train"], out, **{"trainer.resume_mode": "auto", **extra})


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


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], proc.stderr


def test_corrupt_checkpoints_and_pointers_are_one_line_errors(tiny_model_with_weights, arith_data, tmp_path):
    """Corrupt metadata (DCP raises a BaseException), a bad config.json, a `latest` pointing out of
    checkpoints/, and a second run into a directory in use: one line each, from every command."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    cli("train", *_overrides(tiny_model_with_weights, arith_data, out))
    step = out / "checkpoints" / "step_1"
    resume = _overrides(tiny_model_with_weights, arith_data, out, **{"trainer.total_training_steps": 2})
    commands = {
        "auto-resume": ("train", *resume),
        "export": ("export", step, tmp_path / "hf"),
        "eval": ("eval", "--model", out, "--data", arith_data["test"], "--max-response-length", 4),
    }
    meta_file = step / "actor" / "model" / ".metadata"
    original = meta_file.read_bytes()
    meta = pickle.loads(original)
    for info in meta.storage_data.values():
        info.offset = -100
    meta_file.write_bytes(pickle.dumps(meta))
    for name, args in commands.items():
        _one_line_error(cli(*args, check=False), "not a valid checkpoint", "invalid offset")
    meta_file.write_bytes(original)

    config_file = step / "actor" / "config.json"
    config = config_file.read_text()
    config_file.write_text(json.dumps({**json.loads(config), "vocab_size": 2**33}))
    for name, args in commands.items():
        _one_line_error(cli(*args, check=False), "not a valid checkpoint", "config.json")
    config_file.write_text(config)

    (out / "checkpoints" / "latest").write_text(str(tmp_path))
    _one_line_error(cli("train", *resume, check=False), "not the name of a step_N directory")
    (out / "checkpoints" / "latest").write_text("step_1")

    hold = "import sys, time; from pathlib import Path; from hybridrl.trainer import rundir\n"
    hold += "with rundir.locked(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        _one_line_error(cli("train", *resume, check=False), f"in use by another run (pid {holder.pid})")
    finally:
        holder.kill()
        holder.wait()
    cli("train", *resume)  # the holder died: its lock went with it
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()][-1] == 2
