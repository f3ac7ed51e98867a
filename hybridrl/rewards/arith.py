"""Scorer of the quickstart task: integer arithmetic such as ``"37+45="``.

The model is meant to answer with the digits and then stop, so anything else
(words, a repeated prompt, a second number) earns nothing. A strict 0/1 reward
keeps the learning curve easy to read: the mean score is the accuracy.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"-?[0-9]+")


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the response, stripped of whitespace, is exactly the integer
    ``ground_truth``; else 0.0.

    >>> compute_score("82", "82")
    1.0
    >>> compute_score(" 82\\n", "82")
    1.0
    >>> compute_score("-7", "-7")
    1.0
    >>> compute_score("82 is the answer", "82")
    0.0
    >>> compute_score("082", "82")
    0.0
    >>> compute_score("81", "82")
    0.0
    """
    answer = solution_str.strip()
    if not _INTEGER.fullmatch(answer):
        return 0.0
    return 1.0 if answer == str(ground_truth).strip() else 0.0
