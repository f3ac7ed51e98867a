"""The tests' tiny model, one shape for all: nothing is downloaded, every model comes from a config.

- `SHAPE`: its size (over hybridrl.models.tiny.tiny_qwen2_config); the session fixtures
  `tiny_model_dir` and `tiny_model_with_weights` (tests/conftest.py) write it as a model directory
  with the character tokenizer.
- `tiny_qwen2(vocab, ...)`: the same model in memory, seeded (hybridrl.models.tiny.tiny_qwen2 at
  SHAPE), for tests and their spawned worker processes, which import this module by name as they
  do spmd_helpers. A function shipped to Ray workers calls hybridrl.models.tiny.tiny_qwen2 with
  `**SHAPE` itself: Ray's processes cannot import this module.
"""

from __future__ import annotations

from hybridrl.models import tiny

SHAPE = {"hidden_size": 32, "intermediate_size": 64}


def tiny_qwen2(vocab: int, **kwargs):
    """hybridrl.models.tiny.tiny_qwen2 at SHAPE; keyword arguments (seed, dtype, attn, config fields) win."""
    return tiny.tiny_qwen2(vocab, **{**SHAPE, **kwargs})
