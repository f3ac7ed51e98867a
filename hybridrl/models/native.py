"""The native engine's decoder class for an HF config: the dense Llama/Qwen family (`llama.DecoderLM`)
or a mixture of experts (`moe_decoder.MoeDecoderLM`). The engine builds and checks models here."""

from __future__ import annotations

from hybridrl.models import llama, moe, moe_decoder


def decoder_class(config) -> type[llama.DecoderLM]:
    return moe_decoder.MoeDecoderLM if moe.is_moe(config) else llama.DecoderLM


def unsupported_reason(config) -> str | None:
    """Why the native engine cannot run this HF config, or None when it can."""
    if moe.is_moe(config):
        return moe_decoder.MoeDecoderLM.unsupported_reason(config)
    reason = llama.unsupported_reason(config)
    if reason and reason.startswith("architecture"):
        return f"{reason}, {', '.join(moe.MOE_ARCHITECTURES)}"
    return reason


def build_from_hf_config(config, dtype, device, max_positions=None, shard=None) -> llama.DecoderLM:
    """`llama.build_from_hf_config` with the decoder class of `config`."""
    return llama.build_from_hf_config(config, dtype, device, max_positions, shard, cls=decoder_class(config))
