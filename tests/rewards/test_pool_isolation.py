"""What a reward worker may do to the machine is bounded (hybridrl/rewards/pool.py): processes it
starts die with it (also ones that left its session), memory is limited, output is capped and
counted, an `async def` is awaited, and scores out of range count as errors."""

from __future__ import annotations

import os
import signal
import time

import pytest

from hybridrl.rewards import score_batch
from hybridrl.rewards.pool import OUTPUT_SHOWN_PER_CALL, Target, WorkerPool
from hybridrl.rewards.scorer import FunctionScorer

REWARD = """
import asyncio, os, subprocess, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "escape":  # a grandchild that double-forks and leaves the session
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open(ground_truth, "w").write(str(os.getpid()))
                time.sleep(600)
            os._exit(0)
        time.sleep(0.5)
        return 1.0
    if solution_str == "child":  # a plain child in the worker's group
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(ground_truth, "w").write(str(p.pid))
        return 1.0
    if solution_str == "alloc":
        block = bytearray(4 * 2**30)
        return float(len(block))
    if solution_str == "print":
        sys.stdout.write("x" * 2**20)
        os.system("echo from-a-child")
        return 1.0
    if solution_str == "huge":
        return 1e308
    if solution_str == "dict-huge":
        return {"score": -1e300, "length": 5}
    return 1.0

async def async_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0.01)
    return float(solution_str == ground_truth)
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return str(path)


def _item(text, truth="4"):
    return dict(data_source="x", solution_str=text, ground_truth=truth, extra_info=None)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not yet reaped by init) is dead
        return f.read().split(")")[-1].split()[0] != "Z"


def _wait_dead(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("kind", ["child", "escape"])
def test_processes_a_reward_starts_die_with_the_pool(reward_file, tmp_path, kind):
    pid_file = tmp_path / "pid"
    pool = WorkerPool(Target(reward_file, "compute_score"), num_workers=1, timeout_s=10)
    try:
        assert pool.map([_item(kind, str(pid_file))])[0].value == 1.0
        end = time.monotonic() + 5
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < end:
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        assert _alive(pid)
    finally:
        pool.close()
    try:
        assert _wait_dead(pid), f"the reward's {kind} process {pid} outlived the pool"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_memory_is_limited_per_worker(reward_file):
    with WorkerPool(Target(reward_file, "compute_score"), num_workers=1, timeout_s=20, memory_limit_mb=1024) as pool:
        alloc, after = pool.map([_item("alloc"), _item("4")])
    assert alloc.value is None and "MemoryError" in alloc.error and "1024 MB" in alloc.error
    assert after.value == 1.0 and pool.replaced == 0  # the worker survives its failed call


def test_output_is_capped_and_counted(reward_file, capfd):
    with FunctionScorer(WorkerPool(Target(reward_file, "compute_score"), num_workers=1, timeout_s=20)) as scorer:
        out = scorer.pool.map([_item("print"), _item("4")])
        result = scorer.score_batch(["x"], ["print"], ["4"], None)
    assert out[0].value == 1.0 and out[0].output_bytes == 2**20 + len("from-a-child\n")
    assert out[1].output_bytes == 0
    assert result.metrics["output_bytes"] == 2**20 + len("from-a-child\n")
    shown = capfd.readouterr()
    assert len(shown.out) + len(shown.err) < 3 * OUTPUT_SHOWN_PER_CALL + 1000
    assert "more bytes not shown" in shown.err


def test_async_reward_functions_are_awaited(reward_file):
    with WorkerPool(Target(reward_file, "async_score"), num_workers=1, timeout_s=20) as pool:
        assert [o.value for o in pool.map([_item("4"), _item("5")])] == [1.0, 0.0]

    async def in_memory(data_source, solution_str, ground_truth, extra_info=None):
        return 0.25

    with WorkerPool(in_memory, kind="thread", timeout_s=5) as pool:
        assert pool.map([_item("4")])[0].value == 0.25
    assert score_batch(in_memory, ["x"], ["4"], ["4"]).scores == [0.25]


def test_scores_out_of_range_count_as_errors(reward_file):
    with FunctionScorer(WorkerPool(Target(reward_file, "compute_score"), num_workers=1, timeout_s=20)) as scorer:
        result = scorer.score_batch(["x"] * 3, ["huge", "dict-huge", "4"], ["4"] * 3, None)
    assert result.scores == [0.0, 0.0, 1.0] and result.num_errors == 2
