"""Progress bars on a terminal only (hybridrl/tracking/progress.py): `hybridrl eval` draws one over its
prompts when stderr is a terminal (forced here with HYBRIDRL_PROGRESS=1) and prints none to a file; a long
call gets a ticker with the elapsed time."""

from __future__ import annotations

import time

import pytest
from cli_helpers import cli

from hybridrl.tracking import progress


def test_no_bar_where_stderr_is_no_terminal(monkeypatch, capsys):
    monkeypatch.delenv("HYBRIDRL_PROGRESS", raising=False)
    assert not progress.on_terminal()  # pytest captures stderr
    b = progress.bar(10, "evaluating", delay=0)
    b.update(10)
    b.close()
    with progress.ticker("generating", delay=0, every=0.01):
        time.sleep(0.05)
    assert capsys.readouterr().err == ""


def test_a_ticker_shows_the_elapsed_time_of_a_long_call(monkeypatch, capsys):
    monkeypatch.setenv("HYBRIDRL_PROGRESS", "1")
    with progress.ticker("generating 4 x 2 responses", every=0.05):
        time.sleep(0.3)
    assert "generating 4 x 2 responses: 00:00" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_draws_a_bar_on_a_terminal_only(tiny_model_with_weights, arith_data):
    args = ("eval", "--model", tiny_model_with_weights, "--data", arith_data["test"], "--max-response-length", 4)
    shown = cli(*args, env={"HYBRIDRL_PROGRESS": "1"})
    assert "evaluating:" in shown.stderr and "/16 [" in shown.stderr  # one bar over the 16 prompts
    quiet = cli(*args, env={"HYBRIDRL_PROGRESS": ""})
    assert "evaluating" not in quiet.stderr and "arith: accuracy" in quiet.stdout
