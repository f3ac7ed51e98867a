"""Runs never mix or overwrite: a new run refuses an occupied directory or moves the old run
aside; pruning renames before deleting; JSONL readers skip a partial last line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from run_lock_helpers import hold_lock

from hybridrl.tracking.tracker import JsonlLogger, read_jsonl, truncate_jsonl
from hybridrl.trainer import checkpoint as ckpt
from hybridrl.trainer import rundir


def _fake_run(path, steps=(1, 2)):
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": s * 0.5}) + "\n" for s in steps))
    (path / "config.yaml").write_text(f"{rundir.CONFIG_HEADER}, resolved\ntrainer: {{}}\n")


def test_claim_refuses_an_occupied_dir_naming_the_choices(tmp_path):
    run = tmp_path / "run"
    _fake_run(run)
    with pytest.raises(rundir.RunDirError) as e:
        rundir.claim(run, overwrite=False)
    msg = str(e.value)
    assert "\n" not in msg and "config.yaml, metrics.jsonl" in msg
    for choice in ("trainer.resume_mode=auto", "trainer.experiment_name", "trainer.overwrite=true"):
        assert choice in msg
    assert (run / "metrics.jsonl").read_text().count("\n") == 2  # untouched


def test_claim_accepts_a_missing_or_foreign_only_dir(tmp_path):
    assert rundir.claim(tmp_path / "new", overwrite=False) is None
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own file")
    assert rundir.claim(tmp_path / "mine", overwrite=False) is None


def test_overwrite_moves_the_old_run_aside_and_deletes_nothing(tmp_path):
    run = tmp_path / "run"
    _fake_run(run)
    before = (run / "metrics.jsonl").read_text()
    aside = rundir.claim(run, overwrite=True)
    assert not run.exists() and aside.name.startswith("run.old-")
    assert (aside / "metrics.jsonl").read_text() == before
    _fake_run(run)  # the same second again: a distinct name, nothing replaced
    aside2 = rundir.claim(run, overwrite=True)
    assert aside2 != aside and aside.exists() and aside2.exists()


@pytest.mark.parametrize(
    "files",
    [
        {"config.yaml": "name: my-project\nsteps: 3\n"},  # another program's config
        {"config.yaml": "name: x\n", "metrics.jsonl": '{"step": 1}\n'},  # ... beside a file of ours
        {"metrics.jsonl": '{"loss": 0.5}\n{"loss": 0.4}\n'},  # another logger's metrics
        {"checkpoints/model.pt": "weights"},  # another trainer's checkpoints
        {"config.yaml": None},  # a directory by that name
    ],
)
def test_a_folder_hybridrl_did_not_write_is_never_moved(tmp_path, files):
    """trainer.default_local_dir at a folder of another program's files: refused in one line, with
    or without trainer.overwrite, and nothing in it is renamed."""
    folder = tmp_path / "project"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).mkdir() if text is None else (folder / name).write_text(text)
    before = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    for overwrite in (False, True):
        with pytest.raises(rundir.RunDirError) as e:
            rundir.claim(folder, overwrite=overwrite)
        assert "\n" not in str(e.value) and "not a hybridrl run" in str(e.value) and "trainer.default_local_dir" in str(e.value)
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_a_run_written_before_its_config_is_still_ours(tmp_path):
    """A start that crashed before saving config.yaml (in its warm-up) left metrics.jsonl and
    tensorboard/: a run of ours, moved aside so that the rerun goes ahead."""
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0, "warmup/loss": 3.0}\n')
    assert rundir.is_run(run)
    assert rundir.claim(run, overwrite=False).name.startswith("run.old-")


def test_the_current_directory_as_the_run_dir(tmp_path, monkeypatch):
    """trainer.default_local_dir=.: an empty or foreign-free folder takes the run; one holding a
    run is never renamed from under the process (one line, no traceback)."""
    monkeypatch.chdir(tmp_path)
    assert rundir.claim(Path("."), overwrite=False) is None
    _fake_run_files(tmp_path)
    for overwrite in (False, True):
        with pytest.raises(rundir.RunDirError) as e:
            rundir.claim(Path("."), overwrite=overwrite)
        assert "\n" not in str(e.value)
    assert "it is the current directory" in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "metrics.jsonl"]
    monkeypatch.chdir(tmp_path / "..")  # from elsewhere it moves as any other run
    assert rundir.claim(tmp_path, overwrite=True).name.startswith(tmp_path.name + ".old-")


def test_new_jsonl_logger_never_deletes_an_existing_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    logger = JsonlLogger(path, resume_step=None)
    logger.log({"a": 2.0}, 5)
    logger.close()
    assert [r["step"] for r in read_jsonl(path)[0]] == [1, 5]


def test_partial_last_line_is_skipped_and_reported(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "r": 0.25}\n{"step": 2, "r": 0.5}\n{"step": 3, "r": 0.7')  # killed mid-write
    rows, bad = read_jsonl(path)
    assert rows == [{"step": 1, "r": 0.25}, {"step": 2, "r": 0.5}] and bad == 1
    truncate_jsonl(path, 1)
    assert "skipped 1 unreadable line" in capsys.readouterr().out
    assert path.read_text() == '{"step": 1, "r": 0.25}\n'
    JsonlLogger(path, resume_step=1).close()  # resume truncation through the logger reads it too
    assert read_jsonl(path) == ([{"step": 1, "r": 0.25}], 0)


def test_prune_renames_before_deleting(tmp_path, monkeypatch):
    root = tmp_path / "c"
    for step in (1, 2):
        ckpt.finish_save(root, ckpt.begin_save(root, step), step, {"global_step": step}, keep=None)
    # A kill in the middle of the delete: the directory is already renamed out of the step names.
    calls = []
    real_rmtree = ckpt.shutil.rmtree

    def killed(path, *a, **k):
        calls.append(os.path.basename(path))
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.finish_save(root, ckpt.begin_save(root, 3), 3, {"global_step": 3}, keep=2)
    assert calls == [".trash_step_1"]
    assert sorted(p.name for p in root.glob("step_*")) == ["step_2", "step_3"]
    assert ckpt.latest_checkpoint(root).name == "step_3"
    monkeypatch.setattr(ckpt.shutil, "rmtree", real_rmtree)
    ckpt.finish_save(root, ckpt.begin_save(root, 4), 4, {"global_step": 4}, keep=2)  # leftovers go next time
    assert sorted(p.name for p in root.iterdir() if p.name != "latest") == ["step_3", "step_4"]


def test_a_second_run_into_a_locked_dir_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    holder = hold_lock(run)
    try:
        with pytest.raises(rundir.RunDirError) as e:
            with rundir.locked(run):
                pass
        msg = str(e.value)
        assert "\n" not in msg and f"pid {holder.pid}" in msg and "in use by another run" in msg
    finally:
        holder.kill()  # SIGKILL: a crash, no cleanup runs
        holder.wait()
    with rundir.locked(run):  # the kernel dropped the dead holder's lock: the rerun goes ahead
        assert (run / rundir.LOCK).read_text().strip() == str(os.getpid())
        with rundir.locked(run):  # the same process may take it again (the API, then the supervisor)
            pass


def test_another_thread_of_the_process_is_another_run_and_is_refused(tmp_path):
    """Two API runs in two threads (`hybridrl.grpo(output_dir=X)` twice): the second stops in one
    line while the first holds the directory; once the first ends, the directory is free again."""
    import threading

    run = tmp_path / "run"
    held, release, errors = threading.Event(), threading.Event(), []

    def first():
        with rundir.locked(run):
            with rundir.locked(run):  # the holding thread itself re-enters (the API, then the supervisor)
                held.set()
                release.wait(30)

    t = threading.Thread(target=first, name="first-run")
    t.start()
    try:
        assert held.wait(30)
        for _ in range(2):  # the second thread, twice: the refusal leaves the holder's lock alone
            try:
                with rundir.locked(run):
                    errors.append("entered")
            except rundir.RunDirError as e:
                errors.append(str(e))
        assert (run / rundir.LOCK).read_text().strip() == str(os.getpid())
    finally:
        release.set()
        t.join()
    assert (
        errors
        == [
            f"{run} is in use by another run in this process (thread 'first-run'); wait for it to end, "
            "or give this run another trainer.experiment_name (or trainer.default_local_dir)"
        ]
        * 2
    )
    with rundir.locked(run):  # released: this thread takes it
        pass
    assert not run.exists()


def test_overwrite_keeps_the_lock_with_the_new_run(tmp_path):
    run = tmp_path / "run"
    with rundir.locked(run):
        _fake_run_files(run)
        aside = rundir.claim(run, overwrite=True)
        assert (run / rundir.LOCK).exists() and not (aside / rundir.LOCK).exists()
        import subprocess
        import sys

        probe = "import sys; from pathlib import Path; from hybridrl.trainer import rundir\n"
        probe += "with rundir.locked(Path(sys.argv[1])): pass"
        proc = subprocess.run([sys.executable, "-c", probe, str(run)], capture_output=True, text=True)
        assert proc.returncode != 0 and f"pid {os.getpid()}" in proc.stderr


def _fake_run_files(path):
    (path / "metrics.jsonl").write_text('{"step": 1}\n')
    (path / "config.yaml").write_text(f"{rundir.CONFIG_HEADER}, resolved\ntrainer: {{}}\n")


def test_shipped_configs_resume_by_default():
    import yaml

    for name in ("quickstart", "arith_ppo", "dapo_arith", "gsm8k_grpo"):
        trainer = yaml.safe_load(open(f"configs/{name}.yaml"))["trainer"]
        assert trainer.get("resume_mode", "auto") == "auto", name


def test_the_lock_file_goes_with_the_run(tmp_path):
    run = tmp_path / "new" / "run"
    with rundir.locked(run):
        assert (run / rundir.LOCK).exists()
    assert not run.exists()  # nothing was written: the directory made for the lock is removed too
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("kept")
    with rundir.locked(run):
        pass
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]


def test_a_start_that_took_no_step_is_moved_aside_so_the_rerun_runs(tmp_path, capsys):
    run = tmp_path / "run"
    _fake_run(run, steps=(0,))  # the config and the step-0 validation, then a crash
    (run / "tensorboard").mkdir()
    aside = rundir.claim(run, overwrite=False)
    assert not run.exists() and aside.name.startswith("run.old-") and (aside / "config.yaml").exists()
    assert "held a start that took no training step" in capsys.readouterr().out
    _fake_run(run, steps=(0, 1))  # a run that trained a step is never moved without trainer.overwrite
    with pytest.raises(rundir.RunDirError):
        rundir.claim(run, overwrite=False)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    with pytest.raises(rundir.RunDirError):
        rundir.claim(run, overwrite=False)
