"""The tests' tiny models, built in one place: nothing is downloaded, every model comes from a config.

- `SHAPE`: the tiny Qwen2's size (hybridrl.models.tiny.tiny_qwen2_config with it); the session
  fixtures `tiny_model_dir` and `tiny_model_with_weights` (tests/conftest.py) write it as a model
  directory with the character tokenizer.
- `tiny_qwen2(vocab, ...)`: the same model in memory, seeded, for tests and their spawned worker
  processes (which import this module by name, as they do spmd_helpers).
"""

from __future__ import annotations

import torch

from hybridrl.models.tiny import tiny_qwen2_config

SHAPE = {"hidden_size": 32, "intermediate_size": 64}


def tiny_qwen2(vocab: int, *, seed: int = 0, dtype: torch.dtype = torch.float32, attn: str | None = None, **overrides):
    """A seeded tiny Qwen2ForCausalLM; `overrides` change any config field, `attn` picks the
    attention implementation (e.g. "sdpa" for the packed passes)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(**tiny_qwen2_config(vocab, **{**SHAPE, **overrides}))
    if attn is not None:
        cfg._attn_implementation = attn
    return Qwen2ForCausalLM(cfg).to(dtype)
