"""verl's rule-based reward managers (config `reward_model.reward_manager`) and DAPO's overlong shaping.

A manager turns a batch of responses into one score each; they differ in how they call the
reward function:

- ``naive``: ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` once per
  response, in this process (`manager.score_batch`).
- ``dapo``: as naive. (verl's DAPO manager also strips the EOS text from the response; our
  responses are decoded without special tokens, so there is none to strip.) The overlong
  penalty (`overlong_penalty`) is what DAPO adds; it applies under any manager when
  ``reward_model.overlong_buffer.enable`` is set.
- ``batch``: one call ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=)``
  with lists for the whole batch, returning one float or dict per response (`score_all_at_once`).
- ``prime``: one call per response, run in parallel worker processes with a per-response time
  limit; a response whose scorer fails or runs out of time scores 0 (`score_in_processes`).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from hybridrl.config.names import REWARD_MANAGERS

from .manager import MAX_ABS_SCORE, ScoreResult, _as_number, _as_score, _log_first_error, score_batch


def overlong_penalty(lengths: Sequence[int], max_response_length: int, buffer_len: int, penalty_factor: float) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), one value per response.

        expected = max_response_length - buffer_len
        penalty  = min(-(length - expected) / buffer_len * penalty_factor, 0)

    0 up to `expected` tokens, then falling linearly to -penalty_factor at max_response_length.

    >>> overlong_penalty([10, 12, 14, 16], max_response_length=16, buffer_len=4, penalty_factor=1.0)
    [0.0, 0.0, -0.5, -1.0]
    """
    if buffer_len <= 0:
        raise ValueError(f"reward_model.overlong_buffer.len must be > 0, got {buffer_len}")
    expected = max_response_length - buffer_len
    return [min(-(int(n) - expected) / buffer_len * penalty_factor, 0.0) + 0.0 for n in lengths]


def score_all_at_once(
    compute_score: Callable[..., Sequence[Any]],
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
) -> ScoreResult:
    """verl's ``batch`` manager: one call with lists; it returns one number or dict per response.

    If the call raises or returns the wrong number of results, every response scores 0 and
    counts as an error; a single unusable entry scores 0 alone.

    >>> def scorer(data_sources, solution_strs, ground_truths, extra_infos):
    ...     return [float(s == g) for s, g in zip(solution_strs, ground_truths)]
    >>> score_all_at_once(scorer, ["a", "a"], ["4", "5"], ["4", "4"]).scores
    [1.0, 0.0]
    """
    n = len(solution_strs)
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
    try:
        raw = list(
            compute_score(
                data_sources=list(data_sources),
                solution_strs=list(solution_strs),
                ground_truths=list(ground_truths),
                extra_infos=extra_infos,
            )
        )
        if len(raw) != n:
            raise ValueError(f"the batch reward function returned {len(raw)} results for {n} responses")
    except Exception:
        _log_first_error(0, data_sources[0] if n else None, traceback.format_exc())
        return ScoreResult(scores=[0.0] * n, num_errors=n)
    return _collect(raw, data_sources)


def _collect(raw: Sequence[Any], data_sources: Sequence[str]) -> ScoreResult:
    """Numbers or dicts with a numeric "score" -> ScoreResult (the dicts' other numbers as extras)."""
    scores, extras, errors = [], [], 0
    for i, value in enumerate(raw):
        if isinstance(value, dict):
            score = _as_score(value.get("score"))
            extra = {str(k): x for k, v in value.items() if k != "score" and (x := _as_number(v)) is not None}
        else:
            score, extra = _as_score(value), {}
        if score is None:
            errors += 1
            _log_first_error(
                i,
                data_sources[i],
                f"expected a finite number of magnitude <= {MAX_ABS_SCORE:g} or a dict with one as 'score', got {value!r:.200}",
            )
            score, extra = 0.0, {}
        scores.append(score)
        extras.append(extra)
    keys = dict.fromkeys(k for e in extras for k in e)
    return ScoreResult(scores=scores, extras={k: [e.get(k, 0.0) for e in extras] for k in keys}, num_errors=errors)


def _call_one(compute_score, data_source, solution_str, ground_truth, extra_info):
    return compute_score(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info)


def score_in_processes(
    compute_score: Callable[..., Any],
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    *,
    num_processes: int = 8,
    timeout_s: float = 300.0,
) -> ScoreResult:
    """verl's ``prime`` manager: per-response calls in `num_processes` forked processes.

    A response whose call raises, or has not finished `timeout_s` seconds after the batch was
    submitted, scores 0 and counts as an error; the pool is then torn down so a hung scorer
    cannot outlive the step.
    """
    n = len(solution_strs)
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * n
    raw: list[Any] = [None] * n
    pool = cf.ProcessPoolExecutor(max_workers=max(1, min(num_processes, n)), mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [
            pool.submit(_call_one, compute_score, data_sources[i], solution_strs[i], ground_truths[i], extra_infos[i])
            for i in range(n)
        ]
        done, _ = cf.wait(futures, timeout=timeout_s)
        for i, future in enumerate(futures):
            if future in done and future.exception() is None:
                raw[i] = future.result()
            else:
                reason = "timed out" if future not in done else "".join(traceback.format_exception(future.exception()))
                _log_first_error(i, data_sources[i], f"prime reward manager: {reason}")
                raw[i] = _FAILED
    finally:
        for process in list(getattr(pool, "_processes", {}).values()):  # a hung scorer must not keep the pool alive
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
    result = _collect([0.0 if r is _FAILED else r for r in raw], data_sources)
    result.num_errors += sum(r is _FAILED for r in raw)
    return result


_FAILED = object()


def score_with_manager(
    manager: str,
    compute_score: Callable[..., Any],
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
) -> ScoreResult:
    """Score a batch the way `reward_model.reward_manager` says."""
    if manager in ("naive", "dapo"):
        return score_batch(compute_score, data_sources, solution_strs, ground_truths, extra_infos)
    if manager == "batch":
        return score_all_at_once(compute_score, data_sources, solution_strs, ground_truths, extra_infos)
    if manager == "prime":
        return score_in_processes(compute_score, data_sources, solution_strs, ground_truths, extra_infos)
    raise ValueError(f"reward_model.reward_manager={manager!r} is not one of {', '.join(REWARD_MANAGERS)}")


class ManagedScorer:
    """A reward function together with the manager that calls it (`reward_model.reward_manager`).

    The trainer's scoring passes a whole batch to `score_batch`; a bare function is scored the
    naive way (`manager.score_batch`).
    """

    def __init__(self, manager: str, compute_score: Callable[..., Any]):
        if manager not in REWARD_MANAGERS:
            raise ValueError(f"reward_model.reward_manager={manager!r} is not one of {', '.join(REWARD_MANAGERS)}")
        self.manager, self.compute_score = manager, compute_score

    def score_batch(self, data_sources, solution_strs, ground_truths, extra_infos=None) -> ScoreResult:
        return score_with_manager(self.manager, self.compute_score, data_sources, solution_strs, ground_truths, extra_infos)
