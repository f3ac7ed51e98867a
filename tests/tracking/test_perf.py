"""Model FLOPs by hand, and the device peak table."""

import pytest
import torch

from hybridrl.models.loading import load_causal_lm
from hybridrl.tracking import perf


def test_pass_flops_by_hand():
    shape = {"dense": 100, "vocab": 10, "hidden": 4, "layers": 2, "d_attn": 8}
    lens = torch.tensor([3, 5])
    # dense 2*100*8 = 1600; attention 2*2*8*(9 + 25) = 1088; head 2*10*4*6 = 480
    assert perf.pass_flops(shape, lens, targets=6) == 1600 + 1088 + 480
    assert perf.pass_flops(shape, lens, targets=6, lm_head=False) == 1600 + 1088


def test_model_shape_excludes_embedding_and_head(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, random_init=True)
    cfg = model.config
    shape = perf.model_shape(model)
    total = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
    assert shape["dense"] == total - cfg.vocab_size * cfg.hidden_size
    assert (shape["layers"], shape["d_attn"], shape["vocab"]) == (2, cfg.hidden_size, cfg.vocab_size)


def test_a_mixture_of_experts_counts_the_active_experts_only():
    """8 experts, 2 a token: 2 / 8 of the expert weights run per token (MFU of MoE updates)."""
    from hybridrl.models.tiny import tiny_qwen3_moe

    model = tiny_qwen3_moe(40)
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    embed_head = sum(p.numel() for n, p in model.named_parameters() if "embed" in n or "lm_head" in n)
    total = sum(p.numel() for p in model.parameters())
    assert perf.model_shape(model)["dense"] == total - embed_head - experts + experts // 4


def test_mfu_and_peaks():
    assert perf.mfu(989e12, 2.0, 989e12) == pytest.approx(0.5)
    assert perf.mfu(1.0, 1.0, None) is None
    assert perf.device_peak_flops(torch.device("cpu")) is None
    assert perf.max_memory_allocated_gb(torch.device("cpu")) is None
