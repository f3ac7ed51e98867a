"""The end-to-end tests run the CLI in processes forked from a server that imported torch once
(cli_helpers.cli); what they see must be what `python -m hybridrl` in a fresh interpreter gives.
(That the test's OMP_NUM_THREADS reaches a forked command, although OpenMP read it in the server,
is shown by tests/e2e/test_golden_metrics.py: its runs pin one thread and match to the digit.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import cli

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "args",
    [
        ("explain", "configs/quickstart.yaml", "trainer.n_gpus_per_node=2"),  # exit 0, a page of stdout
        ("explain", "configs/quickstart.yaml", "actor_rollout_ref.rollout.nme=hf"),  # a config error: exit 2
        ("train", "configs/nonexistent.yaml"),
        ("no-such-command",),  # argparse: exit 2, usage on stderr
    ],
)
def test_forked_commands_give_what_a_fresh_interpreter_gives(args, monkeypatch):
    forked = cli(*args, check=False, cwd=ROOT)
    monkeypatch.setenv("HYBRIDRL_TEST_CLI", "subprocess")
    fresh = cli(*args, check=False, cwd=ROOT)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.stdout or forked.stderr
