"""The reward worker pool: every way user code can fail costs one item, never the caller."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from hybridrl.rewards.pool import Target, WorkerPool
from hybridrl.rewards.scorer import FunctionScorer

REWARD = """
import os, sys, time, ctypes

def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    if solution_str == "hang":
        time.sleep(60)
    if solution_str == "exit":
        sys.exit(3)
    if solution_str == "os_exit":
        os._exit(7)
    if solution_str == "segfault":
        ctypes.string_at(0)
    if solution_str == "interrupt":
        raise KeyboardInterrupt
    if solution_str == "raise":
        raise ValueError("bad sample")
    if solution_str == "pid":
        return float(os.getpid())
    return scale * float(solution_str == ground_truth)
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return str(path)


def _items(texts, truths=None):
    truths = truths or ["4"] * len(texts)
    return [dict(data_source="x", solution_str=t, ground_truth=g, extra_info=None) for t, g in zip(texts, truths)]


def test_every_failure_kind_costs_one_item_and_order_is_kept(reward_file):
    texts = ["4", "hang", "5", "exit", "4", "os_exit", "segfault", "interrupt", "raise", "4"]
    with WorkerPool(Target(reward_file, "compute_score", {"scale": 0.5}), num_workers=2, timeout_s=1.5, chunk_size=3) as pool:
        out = pool.map(_items(texts))
        assert [o.value for o in out] == [0.5, None, 0.0, None, 0.5, None, None, None, None, 0.5]
        assert [o.timed_out for o in out] == [t == "hang" for t in texts]
        errors = {t: o.error for t, o in zip(texts, out) if o.error}
        assert set(errors) == {"hang", "exit", "os_exit", "segfault", "interrupt", "raise"}
        assert "SystemExit: 3" in errors["exit"] and "KeyboardInterrupt" in errors["interrupt"]
        assert "exit code 7" in errors["os_exit"] and "exit code -11" in errors["segfault"]
        assert "ValueError: bad sample" in errors["raise"] and "timed out after 1.5 s" in errors["hang"]
        assert pool.replaced == 3  # hang, os._exit, segfault; exceptions keep their worker
        again = pool.map(_items(["4", "3"]))  # the replacements work
        assert [o.value for o in again] == [0.5, 0.0]


def test_order_preserved_over_many_chunks(reward_file):
    rng = random.Random(11)
    truths = [str(rng.randint(0, 9)) for _ in range(300)]
    texts = [t if rng.random() < 0.5 else "x" for t in truths]
    with WorkerPool(Target(reward_file, "compute_score"), num_workers=3, timeout_s=5, chunk_size=7) as pool:
        out = pool.map(_items(texts, truths))
    assert [o.value for o in out] == [float(a == b) for a, b in zip(texts, truths)]


def test_a_worker_killed_mid_batch_is_replaced(reward_file):
    with WorkerPool(Target(reward_file, "compute_score"), num_workers=2, timeout_s=5, chunk_size=2) as pool:
        pids = {int(o.value) for o in pool.map(_items(["pid"] * 4))}
        assert len(pids) == 2
        victim = pool.workers[0].proc.pid
        # a hanging item keeps the victim busy while it is killed from outside
        items = _items(["4", "hang", "4", "4", "4", "4"])
        import threading

        threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
        out = pool.map(items)
        assert [o.value for o in out] == [1.0, None, 1.0, 1.0, 1.0, 1.0]
        assert "exit code -9" in out[1].error and not out[1].timed_out
        assert victim not in {w.proc.pid for w in pool.workers} and pool.replaced == 1


def test_thread_pool_times_out_a_hung_builtin_and_goes_on():
    def scorer(data_source, solution_str, ground_truth, extra_info):
        if solution_str == "hang":
            time.sleep(3)
        if solution_str == "exit":
            raise SystemExit(1)
        return float(solution_str == ground_truth)

    with WorkerPool(scorer, kind="thread", num_workers=1, timeout_s=0.5) as pool:
        t = time.monotonic()
        out = pool.map(_items(["4", "hang", "4", "exit", "5"]))
        assert time.monotonic() - t < 2.5
    assert [o.value for o in out] == [1.0, None, 1.0, None, 0.0]
    assert out[1].timed_out and "SystemExit" in out[3].error


def test_score_batch_counts_errors_and_timeouts(reward_file):
    with FunctionScorer(WorkerPool(Target(reward_file, "compute_score"), num_workers=1, timeout_s=1.0)) as scorer:
        result = scorer.score_batch(["x"] * 4, ["4", "hang", "exit", "4"], ["4"] * 4, None)
    assert result.scores == [1.0, 0.0, 0.0, 1.0]
    assert result.num_errors == 2 and result.num_timeouts == 1


def test_a_function_that_cannot_load_fails_at_start(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def other(): pass\n")
    with pytest.raises(RuntimeError, match="defines no 'compute_score'"):
        WorkerPool(Target(str(bad), "compute_score"), num_workers=1)


def test_wrong_custom_signature_is_found_before_training():
    from hybridrl.rewards import check_reward_kwargs

    def two_args(solution_str, ground_truth):
        return 1.0

    with pytest.raises(ValueError, match=r"cannot be called as fn\(data_source=.*unexpected keyword argument 'data_source'"):
        check_reward_kwargs(two_args, {}, ["x"])

    def fine(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    check_reward_kwargs(fine, {}, ["x"])


def test_a_worker_stopped_from_two_threads_at_once_is_stopped_once(reward_file, monkeypatch):
    """`close` (the run ending) and a `map` replacing the same dead worker both stop it: the second
    waits for the first instead of closing the pipe a second time (an EBADF that used to abort
    `close` before the other workers were stopped)."""
    import threading

    from hybridrl.rewards import pool as pool_module

    calls = []
    real = pool_module._kill_marked
    monkeypatch.setattr(pool_module, "_kill_marked", lambda *a: calls.append(a) or real(*a))
    pool = WorkerPool(Target(reward_file, "compute_score"), num_workers=1, timeout_s=5)
    w = pool.workers[0]
    barrier, errors = threading.Barrier(4), []

    def stop():
        barrier.wait()
        try:
            w.stop(kill=True)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=stop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and len(calls) == 1 and w.stopped and not w.proc.is_alive()
    pool.close()  # the stopped worker again: nothing to do
    assert len(calls) == 1


def test_close_stops_every_worker_when_stopping_one_fails(reward_file, monkeypatch):
    pool = WorkerPool(Target(reward_file, "compute_score"), num_workers=3, timeout_s=5)
    first, *others = pool.workers

    def broken(kill=False):
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(first, "stop", broken)
    with pytest.raises(OSError, match="Bad file descriptor"):
        pool.close()
    assert all(not w.proc.is_alive() for w in others) and pool.workers == []
    type(first).stop(first, kill=True)
    assert not first.proc.is_alive()
