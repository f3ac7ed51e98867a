"""A generative reward model's prompt and verdict: the default judge template and parse function.

An LLM judge reads a question, a reference answer and a response, and writes a verdict; the parse
function turns the verdict's text into a score (`reward_model.generative.parse_fn`, a dotted path,
so any function `(text: str) -> float | None` can replace the default; None scores 0 and counts
in reward_model/judge_parse_errors).
"""

from __future__ import annotations

import importlib
import re

DEFAULT_TEMPLATE = (
    "Grade the response to the question. The reference answer is {ground_truth}.\n"
    "Question: {prompt}\nResponse: {response}\n"
    "Reply with one number from 0 (wrong) to 10 (fully correct)."
)


def last_number(text: str) -> float | None:
    """The last number in the judge's text, or None when there is none.

    >>> last_number("The response is correct. Score: 9")
    9.0
    >>> last_number("score -2.5, final") is None, last_number("-2.5")
    (False, -2.5)
    >>> last_number("no verdict") is None
    True
    """
    found = re.findall(r"-?\d+(?:\.\d+)?", text)
    return float(found[-1]) if found else None


def load_parse_fn(path: str):
    """`package.module:function` or `package.module.function` -> the function; one clear line if missing."""
    module, _, name = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(
            f"reward_model.generative.parse_fn={path!r} cannot be loaded ({e}); give module:function, e.g. "
            "hybridrl.rewards.judge:last_number"
        ) from None
    if not callable(fn):
        raise ValueError(f"reward_model.generative.parse_fn={path!r} is not a function")
    return fn
