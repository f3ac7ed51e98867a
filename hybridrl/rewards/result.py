"""What every scorer reads and what it gives back (hybridrl/rewards/scorer.py).

`ScoreInputs`: one entry per response, verl's four fields (`data_source`, `solution_str`,
`ground_truth`, `extra_info`), plus the generated batch for the scorers that read its tokens (a
reward model). `Outcome`: what one call gave for one response, a value or an error. `ScoreResult`:
a batch's scores, 0.0 where the scorer failed, with the failures counted. `ScoreFailure`: raised
by a scorer's own code for one response that could not be scored (a service that did not answer).

One bad sample (a scorer bug on an odd string, a NaN) must not end a run that has trained for
hours: it scores 0.0, is counted in `num_errors` (the trainer logs it as reward/errors), and the
first such failure of the process is logged with its traceback and the scorer's name.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A score beyond this magnitude counts as an error, as NaN and inf do: one sample at 1e308 makes the
# batch mean inf, and the update of that step would be skipped (trainer.max_nonfinite_steps).
MAX_ABS_SCORE = 1e6

logger = logging.getLogger("hybridrl.rewards")


class ScoreFailure(Exception):
    """One response that could not be scored: it scores 0 and counts in reward/errors (reward/timeouts).
    `retry`: asking again may help (a timeout, a refused connection, HTTP 429 or 5xx)."""

    def __init__(self, message: str, retry: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.retry, self.timed_out = retry, timed_out


@dataclass
class ScoreInputs:
    """The responses to score, one entry per response in each list.

    >>> inputs = ScoreInputs(["arith", "arith"], ["4", "5"], ["4", "4"])
    >>> len(inputs), inputs.calls()[1]
    (2, {'data_source': 'arith', 'solution_str': '5', 'ground_truth': '4', 'extra_info': None})
    """

    data_sources: list[str]
    solution_strs: list[str]
    ground_truths: list[Any]
    extra_infos: list[Any] | None = None
    """None: no extra_info for any response."""
    batch: Any = None
    """The generated `Batch` these responses come from, for scorers that read its tokens (the reward
    model and the judge); None where there is no batch (responses scored while others decode)."""

    def __post_init__(self):
        self.data_sources, self.solution_strs = list(self.data_sources), list(self.solution_strs)
        self.ground_truths = list(self.ground_truths)
        n = len(self.solution_strs)
        self.extra_infos = [None] * n if self.extra_infos is None else list(self.extra_infos)
        if {len(self.data_sources), len(self.ground_truths), len(self.extra_infos)} != {n}:
            raise ValueError(
                f"a batch to score needs one entry per sample: {len(self.data_sources)} data_sources, "
                f"{n} solution_strs, {len(self.ground_truths)} ground_truths, {len(self.extra_infos)} extra_infos"
            )

    def __len__(self) -> int:
        return len(self.solution_strs)

    def calls(self) -> list[dict]:
        """One `fn(**call)` keyword set per response, verl's names."""
        return [
            dict(data_source=s, solution_str=t, ground_truth=g, extra_info=e)
            for s, t, g, e in zip(self.data_sources, self.solution_strs, self.ground_truths, self.extra_infos)
        ]

    def lists(self) -> dict:
        """The whole batch as one keyword set of lists, for a batched function (verl's `batch` manager)."""
        return dict(
            data_sources=self.data_sources,
            solution_strs=self.solution_strs,
            ground_truths=self.ground_truths,
            extra_infos=self.extra_infos,
        )


@dataclass
class Outcome:
    """What one call gave for one response."""

    value: Any = None
    error: str | None = None
    """None when the call returned; otherwise what went wrong (the traceback, or one line)."""
    timed_out: bool = False
    output_bytes: int = 0
    """What the call printed (stdout and stderr, its child processes' too), in bytes."""
    stats: dict[str, float | None] = field(default_factory=dict)
    """Numbers about the call the scorer reports per response (a service's latency, its retries);
    `ScoreResult.of` sums them over the batch, or averages those in seconds (a name ending in _s)."""

    @classmethod
    def failed(cls, failure: ScoreFailure, **stats) -> Outcome:
        return cls(error=str(failure), timed_out=failure.timed_out, stats=stats)


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
    """Of those, the samples whose call ran past its time limit."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers about the whole batch a scorer reports (e.g. the remote scorer's latency), logged as reward/<key>."""

    @classmethod
    def of(cls, outcomes: Sequence[Outcome], data_sources: Sequence[str], name: str = "reward function") -> ScoreResult:
        """One `Outcome` per sample -> scores (0.0 for a failure), extras, failure counts and metrics.

        >>> r = ScoreResult.of([Outcome(value={"score": 1, "acc": True}), Outcome(value="x"), Outcome(value=0.5)], ["a"] * 3)
        >>> r.scores, r.extras, r.num_errors
        ([1.0, 0.0, 0.5], {'acc': [1.0, 0.0, 0.0]}, 1)
        """
        scores: list[float] = []
        per_sample_extras: list[dict[str, float]] = []
        num_errors = num_timeouts = output_bytes = 0
        for i, outcome in enumerate(outcomes):
            output_bytes += outcome.output_bytes
            score, sample_extras, error = _score_one(outcome)
            if error is not None:
                num_errors += 1
                num_timeouts += outcome.timed_out
                log_first_error(name, i, data_sources[i], error)
            scores.append(score)
            per_sample_extras.append(sample_extras)
        keys = dict.fromkeys(key for sample in per_sample_extras for key in sample)
        extras = {key: [sample.get(key, 0.0) for sample in per_sample_extras] for key in keys}
        metrics = {"output_bytes": float(output_bytes)} if output_bytes else {}
        metrics.update(_stat_metrics(outcomes))
        return cls(scores=scores, extras=extras, num_errors=num_errors, num_timeouts=num_timeouts, metrics=metrics)


def as_number(value: Any) -> float | None:
    """A finite float, or None. bool counts as 0/1: `return answer == truth` is a natural way to
    write a reward. Strings, None, tensors and NaN/inf are rejected rather than guessed.

    >>> as_number(True), as_number(np.float32(0.5)), as_number("1"), as_number(float("nan"))
    (1.0, 0.5, None, None)
    """
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def as_score(value: Any) -> float | None:
    """A finite number within +-MAX_ABS_SCORE, else None (an error)."""
    number = as_number(value)
    return number if number is not None and abs(number) <= MAX_ABS_SCORE else None


def _score_one(outcome: Outcome) -> tuple[float, dict[str, float], str | None]:
    """(score, numeric extras, error message or None) for one sample."""
    if outcome.error is not None:
        return 0.0, {}, outcome.error
    raw = outcome.value
    if isinstance(raw, dict):
        score = as_score(raw.get("score"))
        sample_extras = {
            str(key): number for key, value in raw.items() if key != "score" and (number := as_number(value)) is not None
        }
    else:
        score, sample_extras = as_score(raw), {}
    if score is None:
        return (
            0.0,
            {},
            f"expected a finite number of magnitude <= {MAX_ABS_SCORE:g} or a dict with one as 'score', got {raw!r:.200}",
        )
    return score, sample_extras, None


def _stat_metrics(outcomes: Sequence[Outcome]) -> dict[str, float]:
    """The outcomes' stats over the batch: seconds (a name ending in _s) averaged over the responses
    that report a number, anything else summed. The same whether a batch is scored at once or in parts."""
    values: dict[str, list[float]] = {}
    for outcome in outcomes:
        for key, value in outcome.stats.items():
            values.setdefault(key, [])
            if value is not None:
                values[key].append(float(value))
    out = {}
    for key, vals in values.items():
        if key.endswith("_s"):
            out[key] = sum(vals) / len(vals) if vals else 0.0
        else:
            out[key] = float(sum(vals))
    return out


# Once per process: a broken scorer fails on every sample, and thousands of identical
# tracebacks would bury the one worth reading. `reset_error_log` starts over (a new run of the API).
_error_logged = [False]


def log_first_error(name: str, index: int, data_source: Any, message: str) -> None:
    """Log the process's first failed sample, naming the scorer, with its traceback or reason."""
    if _error_logged[0]:
        return
    _error_logged[0] = True
    logger.warning(
        "%s failed on sample %d (data_source=%r); it scores 0.0 and counts in reward/errors. "
        "Later failures are counted but not logged.\n%s",
        name,
        index,
        data_source,
        message,
    )


def reset_error_log() -> None:
    """Log the next failure again (each run of the Python API logs its first)."""
    _error_logged[0] = False
