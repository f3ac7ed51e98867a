"""Stopping a run from outside: SIGTERM (a scheduler, `kill`), SIGHUP (a closed terminal) and Ctrl-C
end `hybridrl train` within seconds, saying what they do and ending with one line naming the
signal and the checkpoint to resume from; the exit status is the shell's (143, 129, 130)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import one_step_args

from hybridrl.launch import SignalStop, stop_on_signals


def test_stop_on_signals_raises_in_the_main_thread_and_restores_the_handlers():
    # From the default handlers, as a fresh process has them (an earlier test in this process may have
    # left Ray's driver handlers, which stop_on_signals rightly keeps).
    outer = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for s in outer:
            signal.signal(s, signal.SIG_DFL)
        for sig, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
            with pytest.raises(SignalStop) as e:
                with stop_on_signals():
                    os.kill(os.getpid(), sig)
                    time.sleep(5)  # the handler runs between bytecodes: the sleep is cut short
            assert e.value.signum == sig and e.value.exit_code == code and str(e.value) == f"stopped by {sig.name}"
            assert isinstance(e.value, KeyboardInterrupt)  # unwinds as Ctrl-C does: no `except Exception` swallows it
        assert {s: signal.getsignal(s) for s in outer} == dict.fromkeys(outer, signal.SIG_DFL)
    finally:
        for s, handler in outer.items():
            signal.signal(s, handler)


def test_a_tensorboard_writer_that_does_not_close_is_left_after_a_bound(tmp_path, capsys):
    """The event writer's close once waited out its 120 s flush period after Ctrl-C: the period is
    5 s now, and close returns after CLOSE_S whatever the writer does."""
    from hybridrl.tracking.tracker import TensorBoardLogger

    logger = TensorBoardLogger(tmp_path / "tb")
    assert logger.writer.flush_secs == 5
    logger.log({"x": 1.0}, 1)
    real_close, release = logger.writer.close, __import__("threading").Event()

    def stuck():
        release.wait(60)
        real_close()

    logger.writer.close, logger.CLOSE_S = stuck, 0.5
    started = time.monotonic()
    logger.close()
    assert time.monotonic() - started < 3
    assert "TensorBoard: its event writer did not close within 0.5 s" in capsys.readouterr().out
    release.set()


@pytest.mark.slow  # two tiny training runs in subprocesses
@pytest.mark.parametrize(
    ("sig", "code", "said"), [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted")]
)
def test_a_signal_ends_the_run_in_seconds_with_one_line(tiny_model_with_weights, arith_data, tmp_path, sig, code, said):
    out = tmp_path / "run"
    args = one_step_args(
        tiny_model_with_weights,
        arith_data["train"],
        out,
        **{"trainer.total_training_steps": 500, "trainer.save_freq": 1, "trainer.logger": "[jsonl,tensorboard]"},
    )
    env = {**os.environ, "HYBRIDRL_DEBUG": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hybridrl", "train", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        # Ctrl-C as a terminal's foreground job gets it: a suite started in the background (`pytest &`)
        # hands its children SIGINT ignored, and Python then installs no KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "latest").exists():  # training, with a checkpoint written
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() is not None else "slow"
            time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, stderr[-3000:]
    assert took < 20, took
    assert f"[hybridrl] {said}: closing the loggers and stopping the workers" in stdout
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"hybridrl: {said}; the last checkpoint ") and "trainer.resume_mode=auto" in last, stderr[-3000:]
    assert "Traceback" not in stderr
