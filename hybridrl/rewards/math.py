"""MATH-style scorer: symbolic equivalence through HuggingFace's math_verify.

``math_verify.parse`` pulls the final answer out of the response (``\\boxed{}``
first, then LaTeX or plain expressions) and ``verify`` compares it with the
reference in sympy, so ``\\frac{1}{2}``, ``0.5`` and ``1/2`` all match.
"""

from __future__ import annotations

import threading

# math_verify bounds each parse/compare with signal.alarm, which Python allows
# only in the main thread; elsewhere the call raises. Off the main thread we
# turn the library's timeout off (its documented advice) and accept that a
# pathological expression could run long, rather than score every sample 0.
_TIMEOUT_S = 5


def _as_gold(ground_truth: str) -> str:
    # A bare "2\sqrt{3}" or "(1,2)" parses wrongly or not at all outside
    # math mode; inside \boxed{} it is read as one LaTeX expression.
    if "\\boxed" in ground_truth or "$" in ground_truth:
        return ground_truth
    return "\\boxed{" + ground_truth + "}"


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the response's final answer equals ``ground_truth``
    mathematically, else 0.0. Never raises.

    >>> compute_score("So the answer is $\\\\boxed{\\\\frac{1}{2}}$.", "0.5")
    1.0
    >>> compute_score("\\\\boxed{2\\\\sqrt3}", "2\\\\sqrt{3}")
    1.0
    >>> compute_score("The answer is 71", "72")
    0.0
    >>> compute_score("}}{{$$\\\\boxed{", "1")
    0.0
    """
    # Imported here so the rest of hybridrl works where math-verify is not installed.
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(_as_gold(str(ground_truth)), parsing_timeout=timeout)
        pred = parse(solution_str, parsing_timeout=timeout)
        if not gold or not pred:
            return 0.0
        return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0
    # TimeoutException derives from BaseException, so it needs naming: an
    # answer too slow to check is scored as wrong, not a reason to stop.
    except (Exception, TimeoutException):
        return 0.0
