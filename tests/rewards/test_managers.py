"""verl's reward managers and DAPO's overlong penalty, by hand."""

import time

import pytest

from hybridrl.rewards.managers import (
    ManagedScorer,
    overlong_penalty,
    score_all_at_once,
    score_in_processes,
)


def exact(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise RuntimeError("scorer bug")
    if solution_str == "slow":
        time.sleep(30)
    return {"score": float(solution_str == ground_truth), "len": len(solution_str)}


def batched(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]


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

    result = ManagedScorer("batch", fn).score_batch(["a", "a", "b"], ["1", "2", "3"], ["1", "1", "3"], [{}, {}, {}])
    assert result.scores == [1.0, 0.0, 1.0] and result.num_errors == 0
    assert len(calls) == 1 and calls[0]["solution_strs"] == ["1", "2", "3"] and calls[0]["data_sources"] == ["a", "a", "b"]


def test_batch_manager_failure_or_wrong_count_scores_everything_zero():
    assert score_all_at_once(lambda **kw: [1.0], ["a", "a"], ["1", "1"], ["1", "1"]).scores == [0.0, 0.0]
    result = score_all_at_once(lambda **kw: [1.0, "x"], ["a", "a"], ["1", "1"], ["1", "1"])
    assert result.scores == [1.0, 0.0] and result.num_errors == 1


def test_prime_manager_scores_in_processes_and_zeroes_failures_and_timeouts():
    strs, truths = ["4", "5", "boom", "slow"], ["4", "4", "4", "4"]
    start = time.perf_counter()
    result = score_in_processes(exact, ["a"] * 4, strs, truths, num_processes=4, timeout_s=3.0)
    assert time.perf_counter() - start < 20  # the hung scorer was not waited for
    assert result.scores == [1.0, 0.0, 0.0, 0.0]
    assert result.num_errors == 2
    assert result.extras["len"] == [1.0, 1.0, 0.0, 0.0]


def test_unknown_manager_is_refused():
    with pytest.raises(ValueError, match="is not one of naive, dapo, batch, prime"):
        ManagedScorer("prm", exact)
