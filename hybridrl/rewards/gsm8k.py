"""GSM8K scorer: compare the answer after ``####`` with the reference number.

Semantics follow verl's ``reward_score/gsm8k.py`` so that scores stay comparable
with runs made there: only the tail of the response is searched, the last match
wins, and the comparison is an exact string match against the ground truth.
"""

from __future__ import annotations

import re

# Only the tail is searched: the final answer comes last, and a bound keeps a
# runaway generation from costing a regex scan over thousands of characters.
# 300 is verl's value.
_TAIL_CHARS = 300

_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the final answer found in the last 300 characters, or None.

    ``strict`` takes the last ``#### <number>``; ``flexible`` takes the last
    number anywhere. Commas are removed in both (verl's flexible keeps them), and a
    match of only "." and "," is never a flexible answer (verl may return one). As in verl, ``$`` is not part
    of a number, so ``#### $18`` is not a well-formed strict answer, and a
    trailing full stop stays in the match (``#### 18.`` gives ``"18."``).

    >>> extract_solution("3 + 4 = 7 so 7 * 10 = 70.\\n#### 70")
    '70'
    >>> extract_solution("#### 1 then again #### -1,234")
    '-1234'
    >>> extract_solution("The answer is 42") is None
    True
    >>> extract_solution("The answer is 42, not 41.", method="flexible")
    '41.'
    >>> extract_solution("#### 5" + "x" * 300) is None
    True
    >>> extract_solution("nothing here . .", method="flexible") is None
    True
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_TAIL_CHARS:]
    if method == "strict":
        matches = _STRICT.findall(tail)
    else:
        # A lone "." or "," (sentence punctuation) matches the pattern too.
        matches = [m for m in _NUMBER.findall(tail) if m.strip(".,")]
    if not matches:
        return None
    return matches[-1].replace(",", "")


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    flexible_score: float = 0.0,
    format_needs_work: bool = False,
) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score``
    if an answer was found but differs, 0.0 if none was found.

    ``flexible_score`` (strict method only) is the reward of a response whose *last
    number* is right but that lacks the ``#### N`` form: a format reward gated on
    correctness. ``format_score`` alone pays for ``#### <any number>``, which a
    policy that rarely writes ``####`` learns to emit with no reasoning at all
    (measured: answers collapse to ``#### 12`` within ten steps); credit for a
    right answer in the wrong form cannot be farmed that way.

    ``format_needs_work`` pays ``format_score`` only when the number after ``####``
    also appears earlier in the response, i.e. the answer restates a number the
    response worked out: ``#### <guess>`` with no work before it earns nothing.

    >>> compute_score("so she sold 72 clips.\\n#### 72", "72")
    1.0
    >>> compute_score("#### 71", "72", format_score=0.1)
    0.1
    >>> compute_score("I think it is 72", "72")
    0.0
    >>> compute_score("I think it is 72", "72", method="flexible")
    1.0
    >>> compute_score("so the answer is \\boxed{72}.", "72", flexible_score=0.5)
    0.5
    >>> compute_score("The answer is 72.", "72", flexible_score=0.5)
    0.5
    >>> compute_score("#### 71, or maybe 72", "72", flexible_score=0.5)
    0.0
    >>> compute_score("#### 71", "72", format_score=0.1, format_needs_work=True)
    0.0
    >>> compute_score("60 + 11 = 71 clips. #### 71", "72", format_score=0.1, format_needs_work=True)
    0.1
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        if flexible_score and method == "strict" and _last_number_is(solution_str, ground_truth):
            return float(flexible_score)
        return 0.0
    if answer == str(ground_truth).strip():
        return float(score)
    if format_needs_work and not _worked_out(solution_str, answer):
        return 0.0
    return float(format_score)


def _last_number_is(solution_str: str, ground_truth: str) -> bool:
    """Whether the last number of the response is the answer ("... is 72." ends a sentence)."""
    last = extract_solution(solution_str, "flexible")
    return last is not None and last.rstrip(".") == str(ground_truth).strip()


def _worked_out(solution_str: str, answer: str) -> bool:
    """Whether ``answer`` (commas removed) is a number in the response before its last ``####``."""
    before = solution_str[: solution_str.rfind("####")]
    return any(m.replace(",", "").rstrip(".") == answer.rstrip(".") for m in _NUMBER.findall(before))


def diagnostics(solution_str: str, ground_truth: str) -> dict[str, float]:
    """What a training run needs to see while the format is being learned, whatever the
    reward's weights: the share of responses with a ``#### N`` answer, and accuracy by the
    strict and the flexible (last number) extraction.

    >>> diagnostics("so she sold 72 clips. #### 72", "72")
    {'format': 1.0, 'strict_acc': 1.0, 'flexible_acc': 1.0}
    >>> diagnostics("#### 71", "72")
    {'format': 1.0, 'strict_acc': 0.0, 'flexible_acc': 0.0}
    >>> diagnostics("The answer is 72.", "72")
    {'format': 0.0, 'strict_acc': 0.0, 'flexible_acc': 1.0}
    """
    strict = extract_solution(solution_str, "strict")
    return {
        "format": float(strict is not None),
        "strict_acc": float(strict == str(ground_truth).strip()),
        "flexible_acc": float(_last_number_is(solution_str, ground_truth)),
    }
