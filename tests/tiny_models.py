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


def tiny_moe(vocab: int, *, family: str = "qwen3_moe", unit_scale: bool = True, **kwargs):
    """A seeded tiny mixture of experts (hybridrl.models.tiny.tiny_qwen3_moe; family="qwen2_moe":
    Qwen2-MoE with a shared expert). `unit_scale`: weights of unit-scale outputs instead of HF's
    std 0.02, under which every router is near-uniform (top-k decided by float noise) and a tiny
    model repeats its last token."""
    import torch

    if family == "qwen2_moe":
        from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

        cfg = tiny.tiny_qwen3_moe_config(vocab, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe")
        cfg.update(shared_expert_intermediate_size=48, qkv_bias=True)
        cfg.pop("head_dim")
        cfg.update({k: v for k, v in kwargs.items() if k not in ("seed", "dtype")})
        torch.manual_seed(kwargs.get("seed", 0))
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(**cfg))
        if kwargs.get("dtype") is not None:
            model = model.to(kwargs["dtype"])
    else:
        model = tiny.tiny_qwen3_moe(vocab, **kwargs)
    if unit_scale:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:  # embeddings N(0, 1); matrices (and each expert's) N(0, 1 / fan_in)
                    p.normal_(0, 1.0 if "embed" in name else p.shape[-1] ** -0.5)
                elif name.endswith(".bias"):
                    p.normal_(0, 0.1)
    return model
