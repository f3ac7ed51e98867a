"""Tiny models of a real architecture, built from a config with random weights.

The quickstart and the tests never download weights: they build a Qwen2-architecture model
a few layers deep over a character-level tokenizer that ships in `hybridrl/assets/tiny-arith`.
`python -m hybridrl.models.tiny` regenerates that directory.
"""

from __future__ import annotations

import json
from pathlib import Path

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny-arith"

# One token per character: digits, arithmetic, a few letters for tests with text.
CHARS = list("0123456789+-*=() ,.#") + list("abcdefghijklmnopqrstuvwxyz") + ["\n"]
SPECIAL = ["<pad>", "<eos>"]

# Plain concatenation: the tiny model has no roles to distinguish, and the rows still use
# verl's chat-message format so the same data path serves real instruct models.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def build_tokenizer():
    """A character-level fast tokenizer (`transformers` wrapper over `tokenizers`)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    from tokenizers import decoders

    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


# what the tiny configs share: two layers of 4 query / 2 KV heads, the character tokenizer's ids
_TINY = dict(
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=1,
    torch_dtype="float32",
)


def tiny_qwen2_config(vocab_size: int, **overrides) -> dict:
    """A Qwen2 config small enough to train on two CPU cores in seconds.

    `overrides` may change any field, e.g. to a real model's shape (vocab_size included).
    """
    cfg = dict(
        vocab_size=vocab_size,
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=64,
        intermediate_size=256,
        tie_word_embeddings=True,
        **_TINY,
    )
    cfg.update(overrides)
    return cfg


def tiny_llama_config(vocab_size: int, **overrides) -> dict:
    """`tiny_qwen2_config` with the Llama architecture (SmolLM2's): no attention biases."""
    return tiny_qwen2_config(vocab_size, **{"architectures": ["LlamaForCausalLM"], "model_type": "llama", **overrides})


def tiny_qwen2(vocab_size: int, *, seed: int = 0, dtype=None, attn: str | None = None, **overrides):
    """The tiny model in memory: a `Qwen2ForCausalLM` of `tiny_qwen2_config(vocab_size, **overrides)`
    with weights drawn after `torch.manual_seed(seed)`, cast to `dtype` when given; `attn` sets the
    attention implementation (e.g. "sdpa", which the packed passes need)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return _seeded(Qwen2Config, Qwen2ForCausalLM, tiny_qwen2_config(vocab_size, **overrides), seed, dtype, attn)


def _seeded(config_cls, model_cls, cfg: dict, seed: int, dtype, attn: str | None):
    import torch

    torch.manual_seed(seed)
    config = config_cls(**cfg)
    if attn is not None:
        config._attn_implementation = attn
    model = model_cls(config)
    return model if dtype is None else model.to(dtype)


def tiny_qwen3_moe_config(vocab_size: int, **overrides) -> dict:
    """A Qwen3-MoE config (8 experts, 2 per token, 2 sparse layers) of the tiny Qwen2's size:
    the mixture-of-experts tests and the MoE quickstart (docs/models.md)."""
    cfg = dict(
        vocab_size=vocab_size,
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        hidden_size=32,
        intermediate_size=64,  # dense MLP layers (mlp_only_layers), if any
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        head_dim=8,
        router_aux_loss_coef=0.001,
        tie_word_embeddings=False,
        **_TINY,
    )
    cfg.update(overrides)
    return cfg


def tiny_qwen3_moe(vocab_size: int, *, seed: int = 0, dtype=None, attn: str | None = None, **overrides):
    """`tiny_qwen2` for `tiny_qwen3_moe_config`: a seeded `Qwen3MoeForCausalLM` in memory."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return _seeded(Qwen3MoeConfig, Qwen3MoeForCausalLM, tiny_qwen3_moe_config(vocab_size, **overrides), seed, dtype, attn)


# Qwen3-30B-A3B's shapes (its config.json): `tiny_qwen3_moe_config(**QWEN3_30B_A3B)` is that model
# with random weights (GPU tests and benchmarks; `num_hidden_layers` fewer where memory asks)
QWEN3_30B_A3B = dict(
    vocab_size=151936,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_hidden_layers=48,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
)


# write_tiny_model_dir's families
CONFIGS = {"qwen2": tiny_qwen2_config, "llama": tiny_llama_config, "qwen3_moe": tiny_qwen3_moe_config}


def write_tiny_model_dir(out: str | Path, family: str = "qwen2", **config_overrides) -> Path:
    """Write tokenizer + config.json (no weights) to `out`; load with `model.random_init=true`.
    `family`: qwen2 or llama (dense), or qwen3_moe (mixture of experts)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save_pretrained(out)
    cfg = CONFIGS[family](**{"vocab_size": len(tok), **config_overrides})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


if __name__ == "__main__":
    print(write_tiny_model_dir(ASSET_DIR))
