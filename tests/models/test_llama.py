"""The native decoder's logits equal transformers' on the same weights (float32, CPU)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from hybridrl.models.llama import DecoderLM, build_from_hf_config, unsupported_reason

COMMON = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=6,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
)


def family_configs():
    return {
        "llama": LlamaConfig(**COMMON, rope_theta=500000.0, tie_word_embeddings=False, attention_bias=True),
        "llama3-scaled": LlamaConfig(
            **COMMON,
            tie_word_embeddings=True,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
        "qwen2": Qwen2Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=True),
        # positions 0..39 run past original_max_position_embeddings=16, where the scalings differ
        "qwen2-linear": Qwen2Config(
            **COMMON, tie_word_embeddings=True, rope_parameters=dict(rope_type="linear", rope_theta=1000000.0, factor=4.0)
        ),
        "qwen2-yarn": Qwen2Config(
            **COMMON,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=16),
        ),
        "qwen3": Qwen3Config(**COMMON, head_dim=16, rope_theta=1000000.0, tie_word_embeddings=False),
    }


def hf_model(config, seed=0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missed weight shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def native_from(hf, config):
    model = build_from_hf_config(config, torch.float32, "cpu")
    model.load_state_dict({k: v for k, v in hf.state_dict().items() if k in model.state_dict()}, strict=True)
    return model


@pytest.mark.parametrize("family", list(family_configs()))
def test_logits_match_transformers(family):
    config = family_configs()[family]
    config.architectures = [type(config).__name__.replace("Config", "ForCausalLM")]
    assert unsupported_reason(config) is None
    hf = hf_model(config)
    native = native_from(hf, config)
    ids = torch.randint(0, config.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids).logits
        got = native(ids)
        assert (got - want).abs().max() <= 1e-4
        native.fuse_projections()  # one matmul for q/k/v and for gate/up: same numbers
        assert (native(ids) - want).abs().max() <= 1e-4


def test_unsupported_configs_are_named():
    config = Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=16)
    config.architectures = ["Qwen2ForCausalLM"]
    assert "sliding" in unsupported_reason(config)
    config = LlamaConfig(**COMMON)
    config.architectures = ["MistralForCausalLM"]
    assert "MistralForCausalLM" in unsupported_reason(config)
    with pytest.raises(ValueError, match="does not support"):
        DecoderLM(config)


@pytest.mark.parametrize("scaled", ["qwen2-linear", "qwen2-yarn"])
def test_rope_scaling_changes_the_tables(scaled):
    """The scaled families are not the default rotary under another name: their cos/sin tables
    differ from the unscaled ones (so the logits test above checks the scaling itself)."""
    from hybridrl.models.llama import rope_tables

    plain, config = family_configs()["qwen2"], family_configs()[scaled]
    cos0, _ = rope_tables(plain, 8, 40)
    cos1, _ = rope_tables(config, 8, 40)
    assert not torch.allclose(cos0, cos1, atol=1e-3)
