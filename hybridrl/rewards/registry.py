"""Route a sample to the built-in scorer for its ``data_source``.

The names are those verl's datasets carry, so prepared parquet files from
there score the same here. Anything else needs a custom reward function.
"""

from __future__ import annotations

from typing import Any, Callable

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


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
) -> float | dict[str, float]:
    """Score one response with the built-in scorer for ``data_source``.

    ``extra_info`` is accepted so the signature matches a custom reward
    function's; no built-in scorer uses it.

    >>> default_compute_score("openai/gsm8k", "#### 72", "72")
    1.0
    >>> default_compute_score("arith", "82", "82")
    1.0
    """
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise ValueError(
            f"no built-in reward for data_source {data_source!r}; "
            f"known data sources: {', '.join(KNOWN_DATA_SOURCES)}. "
            "To score other data, set custom_reward_function.path to a Python file "
            "defining compute_score(data_source, solution_str, ground_truth, extra_info)."
        )
    return scorer(solution_str, ground_truth)


def needs_ground_truth(data_source: str) -> bool:
    """Whether the built-in scorer for ``data_source`` reads the ground truth.

    True for every built-in source. False for unknown ones: they are scored
    by a custom function, which decides for itself what it needs, so a data
    loader should not reject rows that lack ``reward_model.ground_truth``.

    >>> needs_ground_truth("gsm8k"), needs_ground_truth("my_dataset")
    (True, False)
    """
    return data_source in _SCORERS
