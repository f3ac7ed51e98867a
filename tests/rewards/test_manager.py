import doctest
import logging

import numpy as np
import pytest

from hybridrl.rewards import (
    KNOWN_DATA_SOURCES,
    ScoreResult,
    default_compute_score,
    needs_ground_truth,
    registry,
    result,
    score_batch,
    scorer,
)


@pytest.fixture(autouse=True)
def fresh_error_log():
    result.reset_error_log()


def test_doctests():
    assert doctest.testmod(result).failed == 0
    assert doctest.testmod(scorer).failed == 0
    assert doctest.testmod(registry).failed == 0


def _run(values):
    """Score one sample per entry of ``values``; the scorer returns (or raises) that entry."""

    def fn(data_source, solution_str, ground_truth, extra_info):
        value = values[int(solution_str)]
        if isinstance(value, Exception):
            raise value
        return value

    n = len(values)
    return score_batch(fn, ["src"] * n, [str(i) for i in range(n)], ["gt"] * n, None)


def test_plain_floats():
    result = _run([1.0, 0.0, 0.5])
    assert result == ScoreResult(scores=[1.0, 0.0, 0.5], extras={}, num_errors=0)


def test_ints_bools_and_numpy_are_numbers():
    result = _run([1, True, False, np.float32(0.25), np.int64(2), np.bool_(True)])
    assert result.scores == [1.0, 1.0, 0.0, 0.25, 2.0, 1.0]
    assert all(type(s) is float for s in result.scores)
    assert result.num_errors == 0


def test_bad_returns_score_zero_and_count():
    result = _run([1.0, None, "1.0", float("nan"), float("inf"), [1.0], 2.0])
    assert result.scores == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]
    assert result.num_errors == 5


def test_exceptions_score_zero_and_batch_goes_on():
    result = _run([ValueError("bad"), 1.0, KeyError("x")])
    assert result.scores == [0.0, 1.0, 0.0]
    assert result.num_errors == 2


def test_dict_returns_collect_numeric_extras():
    result = _run(
        [
            {"score": 1.0, "acc": True, "pred": "72"},
            {"score": 0.0, "len": 7},
            ValueError("bad"),
            {"score": 0.5, "acc": False, "len": float("nan")},
        ]
    )
    assert result.scores == [1.0, 0.0, 0.0, 0.5]
    # missing, failed and non-numeric entries are 0.0; strings are not collected
    assert result.extras == {"acc": [1.0, 0.0, 0.0, 0.0], "len": [0.0, 7.0, 0.0, 0.0]}
    assert result.num_errors == 1


def test_dict_without_numeric_score_is_an_error():
    result = _run([{"acc": 1.0}, {"score": "high", "acc": 1.0}, {"score": 1}])
    assert result.scores == [0.0, 0.0, 1.0]
    assert result.num_errors == 2
    assert result.extras == {}


def test_called_with_keywords():
    seen = []

    def fn(*, data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return 1.0

    result = score_batch(fn, ["a", "b"], ["r1", "r2"], ["g1", "g2"], [{"i": 0}, None])
    assert result.num_errors == 0
    assert seen == [("a", "r1", "g1", {"i": 0}), ("b", "r2", "g2", None)]


def test_length_mismatch():
    with pytest.raises(ValueError, match="one entry per sample"):
        score_batch(default_compute_score, ["arith"], ["1", "2"], ["1", "2"], None)


def test_empty_batch():
    assert score_batch(default_compute_score, [], [], [], []) == ScoreResult([], {}, 0)


def test_first_failure_logged_once_per_process(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.rewards"):
        _run([ValueError("first"), RuntimeError("second")])
        _run([TypeError("third")])
    records = [r for r in caplog.records if r.name == "hybridrl.rewards"]
    assert len(records) == 1
    assert "ValueError: first" in records[0].getMessage()
    assert "Traceback" in records[0].getMessage()


def test_bad_return_is_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="hybridrl.rewards"):
        _run([None])
    assert "None" in caplog.records[-1].getMessage()


# default_compute_score: the dispatch used when no custom function is set.


@pytest.mark.parametrize(
    "source, response, truth, expected",
    [
        ("openai/gsm8k", "#### 72", "72", 1.0),
        ("gsm8k", "the answer is 72", "72", 0.0),  # strict: needs "####"
        ("math", "\\boxed{\\frac12}", "0.5", 1.0),
        ("lighteval/MATH", "\\boxed{3}", "4", 0.0),
        ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{3}", "3", 1.0),
        ("HuggingFaceH4/MATH-500", "$\\boxed{10}$", "10", 1.0),
        ("arith", " 82", "82", 1.0),
        ("arith", "82!", "82", 0.0),
    ],
)
def test_dispatch(source, response, truth, expected):
    assert default_compute_score(source, response, truth) == expected
    assert default_compute_score(source, response, truth, extra_info={"index": 0}) == expected


def test_known_sources():
    assert set(KNOWN_DATA_SOURCES) == {
        "openai/gsm8k",
        "gsm8k",
        "math",
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
        "arith",
    }
    assert all(needs_ground_truth(s) for s in KNOWN_DATA_SOURCES)
    assert not needs_ground_truth("my/dataset")


def test_unknown_source_message():
    with pytest.raises(ValueError) as err:
        default_compute_score("my/dataset", "1", "1")
    message = str(err.value)
    assert "'my/dataset'" in message
    assert "openai/gsm8k" in message and "arith" in message
    assert "custom_reward_function.path" in message


def test_unknown_source_in_batch_counts_as_error():
    result = score_batch(default_compute_score, ["arith", "nope"], ["3", "3"], ["3", "3"], None)
    assert result.scores == [1.0, 0.0]
    assert result.num_errors == 1
