"""Filesystem faults (a full disk, a read-only run directory), the real entry point, and the
inputs that must be accepted (a BOM) or only noticed (settings that do nothing, DPO ties)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hybridrl.cli.main import user_error_message

sys.path.insert(0, str(Path(__file__).parent))
from badinput_common import BASE_YAML, GOOD, assert_one_line_error, good_then, jsonl, run_in_process  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def base(tmp_path, tiny_model_dir, arith_data):
    """A valid tiny GRPO config writing into tmp_path/run."""
    cfg = tmp_path / "c.yaml"
    fmt = dict(model=tiny_model_dir, train=arith_data["train"], test=arith_data["test"], precious=tmp_path / "run")
    cfg.write_text(BASE_YAML.format(**fmt))
    return cfg


# ----------------------------------------------------------------------------- a full disk


@pytest.mark.slow  # a two-step training run
def test_disk_full_while_checkpointing_names_the_intact_checkpoint(base, tmp_path, capfd, monkeypatch):
    """The second checkpoint's write fails with ENOSPC: one line saying so, naming step_1 as the
    checkpoint to resume from, and step_1 (with `latest` pointing at it) is untouched."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if ".tmp_step_2" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    rc, _, err = run_in_process(["train", str(base), "trainer.save_freq=1", "trainer.test_freq=-1"], capfd)
    ckpts = tmp_path / "run" / "checkpoints"
    assert_one_line_error(
        rc,
        err,
        [
            "the disk is full while writing",
            ".tmp_step_2",
            f"the last checkpoint {ckpts / 'step_1'} is intact",
            "trainer.resume_mode=auto",
        ],
    )
    assert (ckpts / "latest").read_text() == "step_1"
    assert json.loads((ckpts / "step_1" / "trainer_state.json").read_text())["global_step"] == 1
    assert [json.loads(x)["step"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1] == 2


def test_disk_full_messages_for_what_torch_really_raises():
    """torch.save reports a short write as RuntimeError('... unexpected pos N vs M'), and
    torch.distributed.checkpoint wraps the OSError of each rank in a CheckpointException; both
    read as a full disk. These are the exceptions a 64 KiB tmpfs produced (torch 2.x)."""
    from torch.distributed.checkpoint.api import CheckpointException

    short_write = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    assert user_error_message(short_write).startswith("the disk is full")
    dcp = CheckpointException("save", {0: (OSError(errno.ENOSPC, "No space left on device"), [])})
    assert user_error_message(dcp).startswith("the disk is full")
    assert user_error_message(RuntimeError("shape mismatch")) is None  # a bug stays a bug


def _mount_tmpfs(where: Path, options: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    return proc.returncode == 0


def test_real_full_tmpfs(tmp_path):
    """On a real 64 KiB tmpfs (where mounting is allowed), the actual exceptions of torch.save and
    torch.distributed.checkpoint map to the disk-full message."""
    import torch.distributed.checkpoint as dcp

    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "size=64k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        for write in (
            lambda: torch.save(torch.zeros(100_000), mnt / "a.pt"),
            lambda: dcp.save({"w": torch.zeros(100_000)}, checkpoint_id=str(mnt / "ck"), no_dist=True),
        ):
            with pytest.raises(BaseException) as e:  # CheckpointException is a BaseException
                write()
            assert user_error_message(e.value).startswith("the disk is full"), repr(e.value)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_read_only_run_directory(base, tmp_path, capfd):
    """A run directory on a read-only mount is refused before anything loads."""
    mnt = tmp_path / "ro"
    if not _mount_tmpfs(mnt, "ro,size=64k"):
        pytest.skip("cannot mount a tmpfs here")
    try:
        rc, _, err = run_in_process(["train", str(base), f"trainer.default_local_dir={mnt}/run"], capfd)
        assert_one_line_error(rc, err, ["trainer.default_local_dir:", "Read-only file system", "writable directory"])
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_permission_denied_while_running_is_one_line(base, tmp_path, capfd, monkeypatch):
    """EACCES from the metrics writer mid-run: one line, the file, and what to do."""
    import hybridrl.trainer.checkpoint as ckpt

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "run" / "checkpoints" / ".tmp_step_1"))

    monkeypatch.setattr(ckpt, "begin_save", denied)
    rc, _, err = run_in_process(
        ["train", str(base), "trainer.save_freq=1", "trainer.test_freq=-1", "trainer.total_training_steps=1"], capfd
    )
    assert_one_line_error(
        rc, err, ["permission denied while writing", ".tmp_step_1", "no checkpoint was written yet", "trainer.default_local_dir"]
    )


# ----------------------------------------------------------------------------- the real entry point


def _cli(*args, env=None):
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    env.pop("HYBRIDRL_DEBUG", None) if "HYBRIDRL_DEBUG" not in (env or {}) else None
    return subprocess.run(
        [sys.executable, "-m", "hybridrl", *map(str, args)], capture_output=True, text=True, env=env, timeout=300, cwd=REPO
    )


@pytest.mark.slow  # four `python -m hybridrl` processes, like tests/e2e
def test_real_entry_point(base, tmp_path):
    """`python -m hybridrl` prints the same one line, no traceback: a Hub-like model id fails at
    once (offline by default), a non-UTF-8 data file and `lr=.inf` stop before training; with
    HYBRIDRL_DEBUG=1 the traceback is shown."""
    started = time.perf_counter()
    proc = _cli("train", base, "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct")
    assert time.perf_counter() - started < 120  # no minute of Hub retries (the import alone takes seconds)
    assert_one_line_error(proc.returncode, proc.stderr, ["'Qwen/Qwen2.5-0.5B-Instruct' does not exist"])

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(good_then().encode() + b'{"prompt": "\xff"}\n')
    proc = _cli("train", base, f"data.train_files={bad}")
    assert_one_line_error(proc.returncode, proc.stderr, [f"{bad}:7: not valid UTF-8"])

    proc = _cli("explain", base, "actor_rollout_ref.actor.optim.lr=.inf")
    assert_one_line_error(proc.returncode, proc.stderr, ["actor_rollout_ref.actor.optim.lr", "finite"])

    proc = _cli("train", base, f"data.train_files={bad}", env={"HYBRIDRL_DEBUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "DataError" in proc.stderr


# ----------------------------------------------------------------------------- accepted, or noticed


def test_byte_order_marks_are_accepted(tmp_path, tiny_model_dir):
    from hybridrl.config import load_config
    from hybridrl.data.converters import read_rows

    data = tmp_path / "bom.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + jsonl(GOOD, GOOD).encode())
    assert read_rows(data) == [GOOD, GOOD]
    cfg = tmp_path / "bom.yaml"
    cfg.write_bytes(b"\xef\xbb\xbf" + b"data:\n  train_batch_size: 12\n")
    assert load_config(cfg, check=False).data.train_batch_size == 12


def test_notices_for_settings_that_do_nothing(base, capfd):
    rc, out, err = run_in_process(["explain", str(base)], capfd)
    assert rc == 0 and err == "" and "Batch plan" in out
    rc, out, err = run_in_process(
        [
            "explain",
            str(base),
            "algorithm.use_kl_in_reward=true",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "critic.optim.lr=0.5",
            "critic.ppo_epochs=3",
        ],
        capfd,
    )
    lines = err.splitlines()
    assert rc == 0 and len(lines) == 2, err
    assert lines[0].startswith("hybridrl: notice: both actor_rollout_ref.actor.use_kl_loss and algorithm.use_kl_in_reward")
    assert lines[1] == (
        "hybridrl: notice: critic.optim.lr, critic.ppo_epochs ignored: no critic runs with "
        "algorithm.adv_estimator=grpo (only gae learns a value function)"
    )


def test_explain_no_path_check_warns_and_plans(base, capfd):
    rc, out, err = run_in_process(
        [
            "explain",
            "--no-path-check",
            str(base),
            "actor_rollout_ref.model.path=/elsewhere/m",
            "data.train_files=/elsewhere/train.parquet",
        ],
        capfd,
    )
    lines = err.splitlines()
    assert rc == 0 and "Batch plan" in out and len(lines) == 2
    assert all(ln.startswith("hybridrl: warning: ") and ln.endswith("(not checked further: --no-path-check)") for ln in lines)
    assert "/elsewhere/m" in lines[0] and "/elsewhere/train.parquet" in lines[1]


def test_rows_accepted_as_they_mean(tmp_path, tiny_model_dir):
    """An integer data_source is its string; a truncated prompt is logged as what the model sees."""
    from hybridrl.data.dataset import load_prompt_records
    from hybridrl.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    data = tmp_path / "d.jsonl"
    data.write_text(
        jsonl({**GOOD, "data_source": 7, "extra_info": None}, {**GOOD, "prompt": [{"role": "user", "content": "12345+678="}]})
    )
    first, long = load_prompt_records(
        str(data), tok, max_prompt_length=6, truncation="left", require_ground_truth=lambda s: False
    )
    assert (first.data_source, first.extra_info) == ("7", {})
    assert long.prompt_ids == tok("12345+678=", add_special_tokens=False)["input_ids"][-6:]
    assert long.raw_prompt == "5+678="  # samples.jsonl shows the 6 tokens the model got, not the 10 of the file


def test_warmup_prompts_follow_data_truncation(tmp_path, tiny_model_dir):
    from hybridrl.data.errors import DataError
    from hybridrl.data.preference import load_warmup_pairs
    from hybridrl.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    data = tmp_path / "w.jsonl"
    data.write_text(jsonl({"prompt": "12345+678=", "response": "12  "}))
    [(prompt, response)] = load_warmup_pairs(str(data), tok, prompt_key="prompt", max_prompt_length=4, truncation="left")
    assert tok.decode(prompt) == "678=" and response == tok("12  ", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with pytest.raises(DataError, match=r"w.jsonl, row 0: the prompt has 10 tokens > data.max_prompt_length=4"):
        load_warmup_pairs(str(data), tok, prompt_key="prompt", max_prompt_length=4, truncation="error")


def test_dpo_ties_are_reported(tmp_path, tiny_model_dir, capsys):
    from hybridrl.data.preference import load_preference_records
    from hybridrl.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    data = tmp_path / "p.jsonl"
    pairs = [{"prompt": "1+2=", "chosen": "3", "rejected": "3" if i in (1, 4) else "4"} for i in range(6)]
    data.write_text(jsonl(*pairs))
    records = load_preference_records(str(data), tok, "dpo", max_prompt_length=8, max_response_length=4)
    assert len(records) == 6
    assert capsys.readouterr().err == (
        f"hybridrl: warning: {data}: 2 of 6 pairs have chosen == rejected (rows 1, 4); "
        "they teach nothing, drop them from the data\n"
    )


def test_ctrl_c_is_one_line_with_the_checkpoint_to_resume(base, tmp_path, capfd, monkeypatch):
    import hybridrl.trainer.supervise as supervise

    def interrupted(cfg, trainer):
        ckpts = tmp_path / "run" / "checkpoints" / "step_3"
        ckpts.mkdir(parents=True)
        (ckpts / "trainer_state.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(supervise, "fit_with_restarts", interrupted)
    monkeypatch.delenv("HYBRIDRL_DEBUG", raising=False)
    rc, _, err = run_in_process(["train", str(base)], capfd)
    assert rc == 130 and "Traceback" not in err
    assert err == (
        f"hybridrl: interrupted; the last checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_3'} is intact "
        "(trainer.resume_mode=auto continues from it)\n"
    )
