"""The engine asks PyTorch for expandable segments (so its re-allocated KV cache keeps its address
and the CUDA graphs stay valid) only where the user has not configured the allocator."""

import pytest

from hybridrl.rollout.native.cache import ALLOC_CONF_KEYS, stable_cache_addresses


@pytest.fixture
def clean_env(monkeypatch):
    for k in ALLOC_CONF_KEYS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_sets_expandable_segments_when_unset(clean_env):
    import os

    assert stable_cache_addresses() is True
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize("key", ALLOC_CONF_KEYS)
@pytest.mark.parametrize("value", ["", "expandable_segments:False", "max_split_size_mb:128"])
def test_the_users_allocator_settings_win(clean_env, key, value):
    import os

    clean_env.setenv(key, value)
    assert stable_cache_addresses() is False
    assert os.environ[key] == value
    assert [k for k in ALLOC_CONF_KEYS if k in os.environ] == [key]
