import doctest

import pytest

from hybridrl.rewards import arith
from hybridrl.rewards.arith import compute_score


def test_doctests():
    assert doctest.testmod(arith).failed == 0


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        ("82", "82", 1.0),
        ("  82 \n", "82", 1.0),
        ("-12", "-12", 1.0),
        ("0", "0", 1.0),
        ("81", "82", 0.0),
        ("12", "-12", 0.0),
        ("082", "82", 0.0),
        ("+82", "82", 0.0),
        ("8 2", "82", 0.0),
        ("82.", "82", 0.0),
        ("82.0", "82", 0.0),
        ("82 82", "82", 0.0),
        ("37+45=82", "82", 0.0),
        ("", "82", 0.0),
        ("-", "-0", 0.0),
    ],
)
def test_compute_score(response, truth, expected):
    assert compute_score(response, truth) == expected
