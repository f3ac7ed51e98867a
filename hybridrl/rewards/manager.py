"""Score a batch of responses, one call of the reward function per sample.

One bad sample (a scorer bug on an odd string, a NaN) must not end a run that
has trained for hours: it scores 0.0, is counted in ``num_errors`` (the trainer
logs it as a metric), and the first such failure is logged with its traceback.
Given a `WorkerPool` (hybridrl/rewards/pool.py) in place of a function, the calls
run there, so a hang (``num_timeouts``), an exit or a crash also costs one sample.
"""

from __future__ import annotations

import logging
import math
import numbers
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .pool import Outcome, WorkerPool, call

# A score beyond this magnitude counts as an error, as NaN and inf do: one sample at 1e308 makes the
# batch mean inf, and the update of that step would be skipped (trainer.max_nonfinite_steps).
MAX_ABS_SCORE = 1e6

logger = logging.getLogger("hybridrl.rewards")

# Once per process: a broken scorer fails on every sample, and thousands of
# identical tracebacks would bury the one worth reading.
_first_error_logged = False


@dataclass
class ScoreResult:
    scores: list[float]
    """One score per sample; 0.0 where the scorer failed."""
    extras: dict[str, list[float]] = field(default_factory=dict)
    """Numeric keys other than "score" from dict returns, one value per sample.
    A sample that lacks a key (or failed) gets 0.0 there, not NaN, so that
    batch means stay finite; read them together with ``num_errors``."""
    num_errors: int = 0
    """Samples whose scorer raised, timed out, exited, crashed or returned something that is not a number."""
    num_timeouts: int = 0
    """Of those, the samples whose call ran past the pool's timeout."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers about the whole batch a scorer reports (e.g. the remote scorer's latency), logged as reward/<key>."""


def _as_number(value: Any) -> float | None:
    # bool counts as 0/1: `return answer == truth` is a natural way to write a
    # reward. Strings, None, tensors and NaN/inf are rejected rather than guessed.
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _as_score(value: Any) -> float | None:
    """A finite number within +-MAX_ABS_SCORE, else None (an error)."""
    number = _as_number(value)
    return number if number is not None and abs(number) <= MAX_ABS_SCORE else None


def _log_first_error(index: int, data_source: Any, message: str) -> None:
    global _first_error_logged
    if _first_error_logged:
        return
    _first_error_logged = True
    logger.warning(
        "reward function failed on sample %d (data_source=%r); it scores 0.0 and "
        "counts in num_errors. Later failures are counted but not logged.\n%s",
        index,
        data_source,
        message,
    )


def score_batch(
    compute_score: Callable[..., float | dict[str, Any]],
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None] | None = None,
) -> ScoreResult:
    """Call ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``
    for each sample. It may return a number or a dict with a numeric "score";
    the dict's other numeric values are collected in ``extras``.

    >>> def scorer(data_source, solution_str, ground_truth, extra_info):
    ...     return {"score": float(solution_str == ground_truth), "length": len(solution_str)}
    >>> result = score_batch(scorer, ["arith"] * 2, ["4", "55"], ["4", "5"], None)
    >>> result.scores, result.extras, result.num_errors
    ([1.0, 0.0], {'length': [1.0, 2.0]}, 0)
    """
    n = len(solution_strs)
    if extra_infos is None:
        extra_infos = [None] * n
    lengths = {len(data_sources), len(ground_truths), len(extra_infos)}
    if lengths != {n}:
        raise ValueError(
            f"score_batch needs one entry per sample: {len(data_sources)} data_sources, "
            f"{n} solution_strs, {len(ground_truths)} ground_truths, {len(extra_infos)} extra_infos"
        )

    calls = [
        dict(data_source=data_sources[i], solution_str=solution_strs[i], ground_truth=ground_truths[i], extra_info=extra_infos[i])
        for i in range(n)
    ]
    return outcomes_to_result(call_each(compute_score, calls), data_sources)


def call_each(compute_score: Callable[..., Any] | WorkerPool, calls: Sequence[dict]) -> list[Outcome]:
    """`compute_score(**call)` for each call, in its `WorkerPool` when it is one: one `Outcome` each."""
    if isinstance(compute_score, WorkerPool):
        return compute_score.map(list(calls))
    return [_call(compute_score, c) for c in calls]


def outcomes_to_result(outcomes: Sequence[Outcome], data_sources: Sequence[str]) -> ScoreResult:
    """One call's `Outcome` per sample -> scores (0.0 for a failure), extras and the failure counts."""
    scores: list[float] = []
    per_sample_extras: list[dict[str, float]] = []
    num_errors = num_timeouts = output_bytes = 0
    for i, outcome in enumerate(outcomes):
        output_bytes += outcome.output_bytes
        score, sample_extras, error = _score_one(outcome)
        if error is not None:
            num_errors += 1
            num_timeouts += outcome.timed_out
            _log_first_error(i, data_sources[i], error)
        scores.append(score)
        per_sample_extras.append(sample_extras)

    keys = dict.fromkeys(key for sample in per_sample_extras for key in sample)
    extras = {key: [sample.get(key, 0.0) for sample in per_sample_extras] for key in keys}
    metrics = {"output_bytes": float(output_bytes)} if output_bytes else {}
    return ScoreResult(scores=scores, extras=extras, num_errors=num_errors, num_timeouts=num_timeouts, metrics=metrics)


def _call(compute_score: Callable[..., Any], kwargs: dict) -> Outcome:
    """In this process, without a pool (the Python API's plain functions)."""
    try:
        return Outcome(value=call(compute_score, kwargs))
    except Exception:
        return Outcome(error=traceback.format_exc())


def _score_one(outcome: Outcome) -> tuple[float, dict[str, float], str | None]:
    """(score, numeric extras, error message or None) for one sample."""
    if outcome.error is not None:
        return 0.0, {}, outcome.error
    raw = outcome.value

    if isinstance(raw, dict):
        score = _as_score(raw.get("score"))
        sample_extras = {
            str(key): number for key, value in raw.items() if key != "score" and (number := _as_number(value)) is not None
        }
    else:
        score, sample_extras = _as_score(raw), {}
    if score is None:
        return (
            0.0,
            {},
            (f"expected a finite number of magnitude <= {MAX_ABS_SCORE:g} or a dict with one as 'score', got {raw!r:.200}"),
        )
    return score, sample_extras, None
