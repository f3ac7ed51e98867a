import doctest

import pytest

from hybridrl.rewards import judge


def test_doctests():
    assert doctest.testmod(judge).failed == 0


def test_parse_fn_paths():
    assert judge.load_parse_fn("hybridrl.rewards.judge:last_number") is judge.last_number
    assert judge.load_parse_fn("hybridrl.rewards.judge.last_number") is judge.last_number
    with pytest.raises(ValueError, match="reward_model.generative.parse_fn='hybridrl.rewards.judge:nope' cannot be loaded"):
        judge.load_parse_fn("hybridrl.rewards.judge:nope")
    with pytest.raises(ValueError, match="is not a function"):
        judge.load_parse_fn("hybridrl.rewards.judge:DEFAULT_TEMPLATE")
