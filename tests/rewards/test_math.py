import doctest
import threading

import pytest

from hybridrl.rewards import math as math_reward
from hybridrl.rewards.math import compute_score


def test_doctests():
    assert doctest.testmod(math_reward).failed == 0


@pytest.mark.parametrize(
    "response, truth",
    [
        ("The answer is $\\boxed{72}$.", "72"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("So $x = \\frac{1}{2}$", "0.5"),
        ("\\boxed{2\\sqrt{3}}", "2\\sqrt{3}"),
        ("\\boxed{(1, 2)}", "(1,2)"),
        ("\\boxed{1 + x^2}", "x^2+1"),
        ("\\boxed{72}", "$72$"),
        ("\\boxed{72}", "\\boxed{72}"),
    ],
)
def test_correct(response, truth):
    assert compute_score(response, truth) == 1.0


@pytest.mark.parametrize(
    "response, truth",
    [
        ("\\boxed{71}", "72"),
        ("no answer here", "72"),
        ("", "72"),
        ("\\boxed{", "1"),
        ("}}{{$$\\frac{", "\\frac{1}{2}"),
        ("\x00\xff" * 50, "3"),
        ("\\boxed{72}", ""),
        ("\\boxed{72}", None),
    ],
)
def test_wrong_or_garbage_scores_zero(response, truth):
    assert compute_score(response, truth) == 0.0


def test_works_off_the_main_thread():
    # signal-based timeouts cannot be set here; the scorer must still answer.
    results = []
    thread = threading.Thread(
        target=lambda: results.extend([compute_score("\\boxed{\\frac{1}{2}}", "0.5"), compute_score("\\boxed{3}", "4")])
    )
    thread.start()
    thread.join()
    assert results == [1.0, 0.0]
