"""Shared prompts on the GPU kernels (varlen and flex packed attention, bf16 autocast, compiled
decoder layers): the log-probs and gradients of a GRPO-shaped batch equal the unshared pass's to
bf16 rounding. Skipped without CUDA (the float64 equality tests run on CPU: tests/models/test_packing.py)."""

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))


@pytest.mark.parametrize("backend", ["varlen", "flex"])
@pytest.mark.parametrize("compiled", [False, True])
def test_shared_prompts_match_unshared_on_the_gpu(backend, compiled):
    from test_packing import grouped_batch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridrl.models.packing import enable_packing, pack, packed_log_probs
    from hybridrl.models.prepare import compile_decoder_layers
    from hybridrl.models.tiny import tiny_qwen2_config

    torch.manual_seed(0)
    cfg = Qwen2Config(
        **tiny_qwen2_config(64, hidden_size=256, intermediate_size=512, num_attention_heads=8, max_position_embeddings=256)
    )
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg).cuda()
    assert enable_packing(model, backend, torch.device("cuda")) == backend
    if compiled:
        compile_decoder_layers(model)
    params = list(model.parameters())
    seqs = [x.cuda() for x in grouped_batch(0, groups=(8, 1, 5, 3), P=40, R=60)]
    out = []
    for share in (False, True):
        packed = pack(*seqs, share_prompts=share)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp, _, _ = packed_log_probs(model, packed)
        out.append((logp.float(), torch.autograd.grad(logp.float().sum(), params)))
    (l0, g0), (l1, g1) = out
    mask = seqs[3].bool()
    assert float((l1 - l0)[mask].abs().max()) < 0.05  # bf16 rounding of log-probs of ~-4
    assert float((l1 - l0)[mask].abs().mean()) < 0.005
    for a, b in zip(g1, g0):
        assert float((a - b).norm()) <= 0.02 * float(b.norm()) + 1e-6
