"""benchmarks/head_sample_fused.py's prototype kernel (the LM head and the sampler in one pass)
draws the engine sampler's tokens and log-probs: under the Triton interpreter on CPU (float32
weights, where the interpreter has no bf16 matmul), directly on a GPU."""

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from triton_helpers import KDEV, RUN_INTERPRETED, require_kernels, run_interpreted

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.slow  # a child pytest
@RUN_INTERPRETED
def test_kernels_under_the_triton_interpreter():
    run_interpreted(__file__, passed=2)


@pytest.mark.parametrize("B, V, tile", [(8, 1000, (16, 128, 32)), (19, 700, (32, 64, 64))])
def test_triton_fused_head_draws_the_engine_samplers_tokens(B, V, tile):
    require_kernels()
    import head_sample_fused as m

    from hybridrl.rollout.native import triton_kernels as kern

    g = torch.Generator().manual_seed(B)
    K = 64
    dtype = torch.float32 if KDEV == "cpu" else torch.bfloat16
    w = (torch.randn(V, K, generator=g) / 8).to(torch.bfloat16).to(dtype).to(KDEV)
    h = (torch.randn(B, K, generator=g) * 4).to(torch.bfloat16).to(dtype).to(KDEV)
    seeds = torch.randint(0, 2**31, (B,), generator=g).to(KDEV)
    pos = torch.randint(0, 1000, (B,), generator=g).to(KDEV)
    inv_t = torch.full((), 1 / 0.7, device=KDEV)
    t0, l0 = torch.empty(B, dtype=torch.int64, device=KDEV), torch.empty(B, device=KDEV)
    t1, l1 = torch.empty_like(t0), torch.empty_like(l0)
    kern.fused_sample(F.linear(h, w).to(torch.bfloat16), seeds, pos, inv_t, t0, l0, False, chunk=128)
    m.fused_head_sample(h, w, seeds, pos, inv_t, t1, l1, *tile, 4, 3)
    assert torch.equal(t0, t1)
    # the log-probs from the float64 logits (rounded to bf16, as both kernels round them)
    x = F.linear(h.double(), w.double()).to(torch.bfloat16).double() * float(inv_t)
    want = x.log_softmax(-1).gather(1, t1[:, None])[:, 0]
    assert torch.allclose(l1.double(), want, atol=0.05)
    assert torch.allclose(l1, l0, atol=0.05)
    assert len(set(t1.tolist())) > B // 2  # draws, not one token everywhere
