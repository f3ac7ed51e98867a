"""Route a sample to the built-in scorer for its ``data_source``.

The names are those verl's datasets carry, so prepared parquet files from
there score the same here. Anything else needs a custom reward function.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

from . import arith, gsm8k, math

_SCORERS: dict[str, Callable[[str, str], float]] = {
    "openai/gsm8k": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "math": math.compute_score,
    "lighteval/MATH": math.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math.compute_score,
    "HuggingFaceH4/MATH-500": math.compute_score,
    "arith": arith.compute_score,
}

KNOWN_DATA_SOURCES: tuple[str, ...] = tuple(_SCORERS)

# Per-sample diagnostics logged beside the reward whatever its weights, as reward/<name>_<key>/mean.
_DIAGNOSTICS: dict[str, tuple[str, Callable[[str, str], dict[str, float]]]] = {
    "openai/gsm8k": ("gsm8k", gsm8k.diagnostics),
    "gsm8k": ("gsm8k", gsm8k.diagnostics),
}


def diagnostic_metrics(
    data_sources: Iterable[str], solution_strs: Iterable[str], ground_truths: Iterable[str]
) -> dict[str, float]:
    """Means of the built-in diagnostics over the samples whose data source has them.

    >>> diagnostic_metrics(["gsm8k", "gsm8k", "arith"], ["#### 72", "it is 72", "5"], ["72", "72", "5"])
    {'reward/gsm8k_format/mean': 0.5, 'reward/gsm8k_strict_acc/mean': 0.5, 'reward/gsm8k_flexible_acc/mean': 1.0}
    """
    sums: dict[str, list[float]] = {}
    for source, text, truth in zip(data_sources, solution_strs, ground_truths):
        if source not in _DIAGNOSTICS:
            continue
        name, fn = _DIAGNOSTICS[source]
        for k, v in fn(text, truth).items():
            sums.setdefault(f"reward/{name}_{k}/mean", []).append(v)
    return {k: sum(v) / len(v) for k, v in sums.items()}


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **kwargs: Any,
) -> float | dict[str, float]:
    """Score one response with the built-in scorer for ``data_source``.

    ``extra_info`` is accepted so the signature matches a custom reward
    function's; no built-in scorer uses it. ``kwargs`` (the config's
    ``custom_reward_function.reward_kwargs``) go to the scorer, e.g. gsm8k's
    ``format_score``.

    >>> default_compute_score("openai/gsm8k", "#### 72", "72")
    1.0
    >>> default_compute_score("arith", "82", "82")
    1.0
    >>> default_compute_score("gsm8k", "#### 71", "72", format_score=0.1)
    0.1
    """
    return scorer_for(data_source)(solution_str, ground_truth, **kwargs)


def scorer_for(data_source: str) -> Callable[..., float]:
    """The built-in scorer of ``data_source``; a ValueError naming the known sources if none."""
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(
            f"no built-in reward for data_source {data_source!r}; "
            f"known data sources: {', '.join(KNOWN_DATA_SOURCES)}. "
            "To score other data, set custom_reward_function.path to a Python file "
            "defining compute_score(data_source, solution_str, ground_truth, extra_info)."
        )
    return scorer


def check_data_sources(data_sources: Iterable[str], files: str = "the training data") -> None:
    """Raise a ValueError naming the data sources no built-in scorer knows: scored by the built-in
    scorers alone, every sample of theirs would be an error, and the run would train on zeros.

    >>> check_data_sources(["gsm8k", "arith"])
    >>> check_data_sources(["gsm8k", "my_set"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: data_source 'my_set' (1 row(s) of the training data) has no built-in reward; ...
    """
    counts: dict[str, int] = {}
    for source in data_sources:
        if source not in _SCORERS:
            counts[source] = counts.get(source, 0) + 1
    if counts:
        shown = ", ".join(f"{s!r} ({n} row(s) of {files})" for s, n in sorted(counts.items()))
        raise ValueError(
            f"data_source {shown} has no built-in reward; known data sources: {', '.join(KNOWN_DATA_SOURCES)}. "
            "Set custom_reward_function.path to a Python file defining compute_score(data_source, solution_str, "
            "ground_truth, extra_info), use a remote reward (custom_reward_function.remote.url), or fix data.reward_fn_key"
        )


def check_reward_kwargs(
    custom_fn: Callable | None, kwargs: dict[str, Any], data_sources: Iterable[str], batched: bool = False
) -> None:
    """Raise a ValueError before training if ``kwargs`` do not fit the scorer(s) they will reach,
    or a custom function cannot be called as ``fn(data_source=, solution_str=, ground_truth=,
    extra_info=)`` (``batched``: ``fn(data_sources=, solution_strs=, ground_truths=, extra_infos=)``
    with lists, verl's batch reward manager). A mismatch would otherwise surface as every sample
    scoring 0 with ``reward/errors`` set.

    >>> check_reward_kwargs(None, {"format_score": 0.1}, ["gsm8k"])
    >>> check_reward_kwargs(None, {"format_scor": 0.1}, ["gsm8k"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: custom_reward_function.reward_kwargs {'format_scor': 0.1} do not fit ... 'format_scor'
    """
    if not kwargs and custom_fn is None:
        return
    call = "fn(data_source=, solution_str=, ground_truth=, extra_info=)"
    if custom_fn is not None and batched:
        call = "fn(data_sources=, solution_strs=, ground_truths=, extra_infos=)"
        lists = dict(data_sources=[], solution_strs=[], ground_truths=[], extra_infos=[])
        targets = [("the batched custom reward function", custom_fn, lists)]
    elif custom_fn is not None:
        targets = [
            ("the custom reward function", custom_fn, dict(data_source="", solution_str="", ground_truth="", extra_info=None))
        ]
    else:
        targets = [
            (f"the built-in scorer of data_source {s!r}", scorer_for(s), dict(solution_str="", ground_truth=""))
            for s in sorted(set(data_sources))
            if s in _SCORERS
        ]
    for what, fn, required in targets:
        try:
            inspect.signature(fn).bind(**required, **kwargs)
        except TypeError as e:
            params = ", ".join(inspect.signature(fn).parameters)
            if not kwargs:
                raise ValueError(f"{what} ({params}) cannot be called as {call}: {e}; see custom_reward_function.path") from None
            raise ValueError(f"custom_reward_function.reward_kwargs {kwargs} do not fit {what} ({params}): {e}") from None


def needs_ground_truth(data_source: str) -> bool:
    """Whether the built-in scorer for ``data_source`` reads the ground truth.

    True for every built-in source. False for unknown ones: they are scored
    by a custom function, which decides for itself what it needs, so a data
    loader should not reject rows that lack ``reward_model.ground_truth``.

    >>> needs_ground_truth("gsm8k"), needs_ground_truth("my_dataset")
    (True, False)
    """
    return data_source in _SCORERS
