"""verl's reward managers (hybridrl/rewards/assembly.py), DAPO's overlong penalty, by hand; and every
user function, batched or per response, from a file or given in Python, in the same isolation: a
call that hangs, exits, is interrupted, allocates past its limit or prints without end costs its
responses a counted 0, with a message naming the function, and no worker outlives its scorer."""

import logging
import os
import textwrap
import time

import pytest

from hybridrl.config import ConfigError, config_from_dict, load_config
from hybridrl.rewards import ScoreInputs, result
from hybridrl.rewards.assembly import build_scorer
from hybridrl.rewards.pool import OUTPUT_SHOWN_PER_CALL, WorkerPool
from hybridrl.rewards.scorer import BatchScorer
from hybridrl.rewards.stage import overlong_penalty


def exact(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise RuntimeError("scorer bug")
    if solution_str == "slow":
        time.sleep(30)
    return {"score": float(solution_str == ground_truth), "len": len(solution_str)}


def batched(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]


def cfg_with(path=None, **reward):
    custom = {"timeout_s": reward.pop("timeout_s", 10.0), "num_workers": reward.pop("num_workers", 2)}
    custom.update({k: reward.pop(k) for k in ("memory_limit_mb",) if k in reward})
    if path:
        custom.update(path=str(path), name=reward.pop("name", "compute_score"))
    return config_from_dict(
        {
            "data": {"train_files": "unused.jsonl"},
            "actor_rollout_ref": {"model": {"path": "unused"}},
            "custom_reward_function": custom,
            "reward_model": reward,
            "trainer": {"device": "cpu"},
        }
    )


@pytest.fixture(autouse=True)
def fresh_error_log():
    result.reset_error_log()


def test_overlong_penalty_falls_linearly_over_the_buffer():
    # max 20, buffer 8: free up to 12 tokens, then -factor * (len - 12) / 8
    assert overlong_penalty([5, 12, 13, 16, 20], 20, 8, 2.0) == [0.0, 0.0, -0.25, -1.0, -2.0]
    with pytest.raises(ValueError, match="overlong_buffer.len must be > 0"):
        overlong_penalty([1], 20, 0, 1.0)


def test_batch_manager_calls_the_function_once_with_lists():
    calls = []

    def fn(**kw):
        calls.append(kw)
        return batched(**kw)

    with BatchScorer(WorkerPool(fn, kind="thread")) as scorer:  # a thread: the calls are seen here
        got = scorer.score_batch(["a", "a", "b"], ["1", "2", "3"], ["1", "1", "3"], [{}, {}, {}])
    assert got.scores == [1.0, 0.0, 1.0] and got.num_errors == 0
    assert len(calls) == 1 and calls[0]["solution_strs"] == ["1", "2", "3"] and calls[0]["data_sources"] == ["a", "a", "b"]


def test_batch_manager_failure_or_wrong_count_scores_everything_zero():
    with BatchScorer(WorkerPool(lambda **kw: [1.0], kind="thread")) as scorer:
        assert scorer.score_batch(["a", "a"], ["1", "1"], ["1", "1"]).scores == [0.0, 0.0]
    with BatchScorer(WorkerPool(lambda **kw: [1.0, "x"], kind="thread")) as scorer:
        got = scorer.score_batch(["a", "a"], ["1", "1"], ["1", "1"])
    assert got.scores == [1.0, 0.0] and got.num_errors == 1


def test_prime_manager_scores_in_processes_and_zeroes_failures_and_timeouts():
    strs, truths = ["4", "5", "boom", "slow"], ["4", "4", "4", "4"]
    start = time.perf_counter()
    with build_scorer(cfg_with(reward_manager="prime", num_workers=4, timeout_s=3.0), exact) as scorer:
        assert scorer.pool.kind == "fork"  # a function given in Python: forks of this process
        got = scorer.score_batch(["a"] * 4, strs, truths)
    assert time.perf_counter() - start < 20  # the hung scorer was not waited for
    assert got.scores == [1.0, 0.0, 0.0, 0.0]
    assert got.num_errors == 2 and got.num_timeouts == 1
    assert got.extras["len"] == [1.0, 1.0, 0.0, 0.0]


def test_unknown_manager_is_refused():
    with pytest.raises(ConfigError, match="is not one of naive, dapo, batch, prime"):
        load_config(None, ["actor_rollout_ref.model.path=m", "data.train_files=t.jsonl", "reward_model.reward_manager=prm"])


# -- isolation of every user function (issue 54: the batch and prime managers, TRL-form functions) -----

MISBEHAVING = """
import os, sys, time

def _act(texts):
    for t in texts:
        if t == "hang":
            time.sleep(600)
        if t == "os_exit":
            os._exit(7)
        if t == "sys_exit":
            sys.exit(3)
        if t == "interrupt":
            raise KeyboardInterrupt
        if t == "alloc":
            block = bytearray(3 * 2**30)
        if t == "print":
            sys.stdout.write("x" * 2**20)

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    _act([solution_str])
    return float(solution_str == ground_truth)

def compute_batch(data_sources, solution_strs, ground_truths, extra_infos):
    _act(solution_strs)
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]
"""
FAILURES = ["hang", "os_exit", "sys_exit", "interrupt", "alloc"]
SAYS = {"hang": "timed out after 2 s", "os_exit": "exit code 7", "sys_exit": "SystemExit: 3", "interrupt": "KeyboardInterrupt"}
SAYS["alloc"] = "MemoryError"


def _namespace():
    spaces = {}
    exec(MISBEHAVING, spaces)
    return spaces


def _scorers(tmp_path, batched_form: bool):
    """The same function as every manager and origin gets it: from a file (spawned workers) and given
    in Python (forked workers), per response (naive, prime) or batched (batch)."""
    path = tmp_path / "reward.py"
    path.write_text(MISBEHAVING)
    limits = dict(timeout_s=2.0, num_workers=2, memory_limit_mb=1024)
    given = _namespace()
    if batched_form:
        yield "file, batch", build_scorer(cfg_with(path, name="compute_batch", reward_manager="batch", **limits))
        given["compute_batch"].batched = True  # hybridrl.batched_reward
        yield "python, batched", build_scorer(cfg_with(**limits), given["compute_batch"])
    else:
        yield "file, prime", build_scorer(cfg_with(path, reward_manager="prime", **limits))
        yield "python, prime", build_scorer(cfg_with(reward_manager="prime", **limits), given["compute_score"])


def _worker_pids(scorer):
    return [w.proc.pid for w in scorer.pool.workers]


def _gone(pids, seconds=10.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        alive = [
            p for p in pids if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split(")")[-1].split()[0] != "Z"
        ]
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_batched_function_that_misbehaves_costs_its_batch_not_the_run(tmp_path, caplog):
    """One call per batch: a hang past timeout_s, an exit, an interrupt or an allocation past
    memory_limit_mb fails that call, so every response of the batch scores 0 and is counted; the
    next batch is scored by a fresh worker."""
    for origin, scorer in _scorers(tmp_path, batched_form=True):
        with scorer, caplog.at_level(logging.WARNING, logger="hybridrl.rewards"):
            for failure in FAILURES:
                result.reset_error_log()
                start = time.monotonic()
                bad = scorer.score(ScoreInputs(["x"] * 3, ["4", failure, "5"], ["4"] * 3))
                assert time.monotonic() - start < 15, (origin, failure)  # bounded by the timeout, not the 600 s sleep
                assert bad.scores == [0.0] * 3 and bad.num_errors == 3, (origin, failure)
                assert bad.num_timeouts == (3 if failure == "hang" else 0), (origin, failure)
                message = caplog.records[-1].getMessage()
                assert "reward function compute_batch" in message and SAYS[failure] in message, (origin, message)
            good = scorer.score(ScoreInputs(["x"] * 2, ["4", "5"], ["4"] * 2))
            pids = _worker_pids(scorer)
        assert good.scores == [1.0, 0.0] and good.num_errors == 0, origin
        assert _gone(pids), f"{origin}: a worker outlived its scorer"


@pytest.mark.slow
def test_a_per_response_function_that_misbehaves_costs_its_responses_not_the_run(tmp_path, caplog):
    texts = ["4", *FAILURES, "5", "4"]
    for origin, scorer in _scorers(tmp_path, batched_form=False):
        result.reset_error_log()
        with scorer, caplog.at_level(logging.WARNING, logger="hybridrl.rewards"):
            got = scorer.score(ScoreInputs(["x"] * len(texts), texts, ["4"] * len(texts)))
            pids = _worker_pids(scorer)
        assert got.scores == [1.0] + [0.0] * len(FAILURES) + [0.0, 1.0], origin
        assert got.num_errors == len(FAILURES) and got.num_timeouts == 1, origin
        message = caplog.records[-1].getMessage()
        assert "reward function compute_score" in message and "failed on sample 1" in message, (origin, message)
        assert _gone(pids), f"{origin}: a worker outlived its scorer"


def test_output_of_a_function_given_in_python_is_capped_and_counted(capfd):
    batched_fn = _namespace()["compute_batch"]
    batched_fn.batched = True
    with build_scorer(cfg_with(num_workers=1), batched_fn) as scorer:
        got = scorer.score(ScoreInputs(["x"] * 2, ["print", "4"], ["4"] * 2))
    assert got.scores == [0.0, 1.0] and got.metrics["output_bytes"] == 2**20
    shown = capfd.readouterr()
    assert len(shown.out) + len(shown.err) < 2 * OUTPUT_SHOWN_PER_CALL + 1000 and "more bytes not shown" in shown.err


@pytest.mark.parametrize("origin", ["file", "python"])
def test_closing_a_scorer_mid_batch_ends_its_hung_calls_at_once(tmp_path, origin):
    """A run that ends (an error, Ctrl-C) while a batch of hanging calls is being scored in the
    background: the scorer's close kills the workers inside their calls, without waiting out a
    timeout per call, and the batch's result raises instead of scoring on."""
    import threading

    path = tmp_path / "reward.py"
    path.write_text(MISBEHAVING)
    limits = dict(timeout_s=60.0, num_workers=2)
    if origin == "file":
        scorer = build_scorer(cfg_with(path, reward_manager="prime", **limits))
    else:
        scorer = build_scorer(cfg_with(reward_manager="prime", **limits), _namespace()["compute_score"])
    pids = _worker_pids(scorer)
    pending = scorer.submit(ScoreInputs(["x"] * 6, ["hang"] * 6, ["4"] * 6))  # 6 x 60 s if waited out
    time.sleep(0.5)
    closing = threading.Thread(target=scorer.close)
    start = time.monotonic()
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive() and time.monotonic() - start < 15
    with pytest.raises(RuntimeError, match="the reward pool was closed"):
        pending.result()
    assert _gone(pids) and scorer.pool.workers == []


def test_a_forked_worker_dies_with_a_killed_trainer(tmp_path):
    """A trainer killed with SIGKILL runs no cleanup: its forked reward workers, mid-call in a hang,
    end with it (the parent-death signal) instead of living on as copies of the trainer."""
    import subprocess
    import sys

    script = tmp_path / "trainer.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from hybridrl.rewards.pool import WorkerPool
            pool = WorkerPool(lambda **kw: time.sleep(600), kind="fork", num_workers=2, timeout_s=600)
            print(*[w.proc.pid for w in pool.workers], flush=True)
            pool.map([{}, {}])
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and not _gone(pids, seconds=0.5)  # both alive, inside the hung call
    finally:
        proc.kill()
        proc.wait()
    assert _gone(pids), "a forked reward worker outlived the killed trainer"
