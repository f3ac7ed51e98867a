"""Paged attention and sampling: the gather reference against plain attention, and the Triton
kernels (run by the Triton interpreter on CPU) against the torch references."""

import pytest
import torch
import torch.nn.functional as F
from triton_helpers import KDEV, RUN_INTERPRETED, require_kernels, run_interpreted

from hybridrl.rollout.native.attention import paged_decode_reference
from hybridrl.rollout.native.sampling import sample


def paged_setup(seed=0, B=3, H=4, n_kv=2, D=16, bs=4, lens=(5, 12, 1)):
    """Random K/V for B sequences scattered over shuffled blocks, plus the same K/V unpaged."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // bs) for n in lens)
    num_blocks = 1 + B * max_blocks
    cache_k = torch.randn(num_blocks, bs, n_kv, D, generator=g)
    cache_v = torch.randn(num_blocks, bs, n_kv, D, generator=g)
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).view(B, max_blocks)  # (B, M) block ids, not in order
    q = torch.randn(B, H, D, generator=g)
    return q, cache_k, cache_v, perm.int(), torch.tensor(lens, dtype=torch.int32)


def unpaged(q, cache_k, cache_v, tables, lens):
    """Each sequence's K/V laid out contiguously, then plain SDPA over its length."""
    outs = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        k = torch.cat([cache_k[int(i)] for i in tables[b]])[:n]  # (n, Hkv, D)
        v = torch.cat([cache_v[int(i)] for i in tables[b]])[:n]
        o = F.scaled_dot_product_attention(q[b][:, None], k.transpose(0, 1), v.transpose(0, 1), enable_gqa=True)
        outs.append(o[:, 0])
    return torch.stack(outs)


def test_paged_reference_equals_unpaged_attention():
    args = paged_setup()
    torch.testing.assert_close(paged_decode_reference(*args), unpaged(*args), atol=1e-5, rtol=0)


def test_sampling_reproducible_and_row_independent():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    seeds = torch.tensor([1, 2, 3, 4])
    pos = torch.tensor([7, 7, 9, 9])
    t1, lp1 = sample(logits, seeds, pos, 1.0)
    # the same row alone, and in another row order, samples the same token
    t2, _ = sample(logits[[2, 0]], seeds[[2, 0]], pos[[2, 0]], 1.0)
    assert t2.tolist() == [t1[2].item(), t1[0].item()]
    # log-prob of the sampled token under softmax(logits / T)
    torch.testing.assert_close(lp1, torch.log_softmax(logits, -1).gather(-1, t1[:, None])[:, 0])
    # other seeds give other tokens (over many draws)
    many = torch.stack([sample(logits, seeds + s, pos, 1.0)[0] for s in range(20)])
    assert len({tuple(r.tolist()) for r in many}) > 10


def test_gumbel_sampling_follows_the_distribution():
    """Empirical frequencies over 20k seeds match softmax(logits / T), top-k and top-p respected."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    N = 20000
    seeds = torch.arange(N)
    toks, _ = sample(logits.expand(N, -1), seeds, torch.zeros(N, dtype=torch.long), 0.7)
    freq = torch.bincount(toks, minlength=5).float() / N
    torch.testing.assert_close(freq, torch.softmax(logits[0] / 0.7, -1), atol=0.015, rtol=0)
    toks, _ = sample(logits.expand(N, -1), seeds, torch.zeros(N, dtype=torch.long), 1.0, top_k=2)
    assert set(toks.tolist()) == {0, 1}
    # probabilities 0.563, 0.207, 0.126, ...: a 0.7 nucleus is tokens {0, 1}, renormalized
    toks, _ = sample(logits.expand(N, -1), seeds, torch.zeros(N, dtype=torch.long), 1.0, top_p=0.7)
    assert set(toks.tolist()) == {0, 1}
    assert abs((toks == 0).float().mean().item() - 0.563 / (0.563 + 0.207)) < 0.015


@pytest.fixture
def kernels():
    require_kernels()
    from hybridrl.rollout.native import triton_kernels

    return triton_kernels


@pytest.mark.slow  # a child pytest: ~10 s
@RUN_INTERPRETED
def test_kernels_under_the_triton_interpreter():
    run_interpreted(__file__, passed=16)


@pytest.mark.parametrize("H, n_kv, D, bs", [(4, 2, 16, 4), (6, 2, 32, 16), (2, 2, 8, 8)])
def test_triton_paged_decode_matches_reference(kernels, H, n_kv, D, bs):
    paged_decode = kernels.paged_decode
    args = [a.to(KDEV) for a in paged_setup(H=H, n_kv=n_kv, D=D, bs=bs, lens=(5, 70, 1, 33), B=4)]  # D=8: padded
    torch.testing.assert_close(paged_decode(*args), paged_decode_reference(*args), atol=1e-4, rtol=0)
    if KDEV == "cuda":  # bf16, as the engine runs it
        bf = [a.bfloat16() if a.is_floating_point() else a for a in args]
        torch.testing.assert_close(paged_decode(*bf).float(), paged_decode_reference(*bf).float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("greedy", [False, True])
def test_triton_sampler_matches_torch(kernels, greedy):
    fused_sample = kernels.fused_sample
    torch.manual_seed(0)
    B, V = 6, 9000  # several vocabulary chunks
    logits = (torch.randn(B, V) * 3).to(KDEV)
    seeds, pos = (torch.arange(B) * 1000 + 7).to(KDEV), (torch.arange(B) + 3).to(KDEV)
    temp = 0.0 if greedy else 0.8
    want_t, want_lp = sample(logits, seeds, pos, temp)
    toks, lps = torch.empty(B, dtype=torch.long, device=KDEV), torch.empty(B, device=KDEV)
    inv_t = torch.tensor(1.0 if greedy else 1 / temp, device=KDEV)
    fused_sample(logits, seeds, pos, inv_t, toks, lps, greedy)
    assert toks.tolist() == want_t.tolist()
    torch.testing.assert_close(lps, want_lp, atol=1e-4, rtol=0)
    # the key's position offset (the decode step passes the input positions and offset 1)
    want_t1, want_lp1 = sample(logits, seeds, pos + 1, temp)
    fused_sample(logits, seeds, pos, inv_t, toks, lps, greedy, pos_offset=1)
    assert toks.tolist() == want_t1.tolist()
    torch.testing.assert_close(lps, want_lp1, atol=1e-4, rtol=0)
    if not greedy:
        assert want_t1.tolist() != want_t.tolist()  # the offset changes the noise


def test_triton_noise_matches_torch_at_the_extremes(kernels):
    """The fused sampler's noise (`_gumbel`) against sampling.gumbel_noise's: the hash values near
    u = 1 (the series branch, and the clamp for the one value that rounds to u = 1.0), near u = 0,
    around the branch point w = 1/16, and random ones. On CUDA tests/gpu checks all 2**24."""
    from sampler_stats import unmix32

    from hybridrl.rollout.native.sampling import gumbel_noise

    k = torch.cat(
        [
            torch.arange(2**24 - 4096, 2**24),
            torch.arange(0, 4096),
            torch.arange(int(2**24 * 15 / 16) - 2048, int(2**24 * 15 / 16) + 2048),
            torch.randint(0, 2**24, (8192,)),
        ]
    )
    h = (k << 8) | torch.randint(0, 256, k.shape)
    got = kernels.noise_from_hash(h.to(KDEV)).cpu()
    want = gumbel_noise(unmix32(h), 1)[:, 0]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=3e-6 if KDEV == "cuda" else 1e-6, rtol=0)


@pytest.mark.parametrize("greedy", [False, True])
def test_triton_sampler_never_draws_past_the_vocabulary_limit(kernels, greedy):
    torch.manual_seed(1)
    B, V, limit = 8, 9000, 8500
    logits = torch.randn(B, V)
    logits[:, limit:] += 8.0
    logits = logits.to(KDEV)
    seeds, pos = torch.arange(B).to(KDEV) * 31 + 5, torch.arange(B).to(KDEV)
    temp = 0.0 if greedy else 1.0
    want_t, want_lp = sample(logits, seeds, pos, temp, vocab_limit=limit)
    toks, lps = torch.empty(B, dtype=torch.long, device=KDEV), torch.empty(B, device=KDEV)
    kernels.fused_sample(logits, seeds, pos, torch.tensor(1.0, device=KDEV), toks, lps, greedy, vocab_limit=limit)
    assert int(toks.max()) < limit
    assert toks.tolist() == want_t.tolist()
    torch.testing.assert_close(lps, want_lp, atol=1e-4, rtol=0)


def test_triton_rope_and_store_matches_torch(kernels):
    from transformers import Qwen2Config

    from hybridrl.models.llama import rope_tables, rotary
    from hybridrl.rollout.native.cache import write_kv

    torch.manual_seed(0)
    N, H, n_kv, D, bs, nb = 5, 6, 2, 16, 4, 6
    cos, sin = (t.to(KDEV) for t in rope_tables(Qwen2Config(rope_theta=10000.0), D, 64))
    q, k, v = (torch.randn(N, h, D, device=KDEV) for h in (H, n_kv, n_kv))
    pos = torch.tensor([0, 3, 17, 40, 63], device=KDEV)
    slots = torch.tensor([4, 9, 10, 23, 5], device=KDEV)
    ck, cv = torch.zeros(nb, bs, n_kv, D, device=KDEV), torch.zeros(nb, bs, n_kv, D, device=KDEV)
    q_out = kernels.rope_and_store(q, k, v, cos, sin, pos, slots, ck, cv)
    c, s_ = cos[pos][:, None, None], sin[pos][:, None, None]  # (N, 1, 1, D)
    want_q, want_k = rotary(q[:, None], c, s_)[:, 0], rotary(k[:, None], c, s_)[:, 0]
    rk, rv = torch.zeros_like(ck), torch.zeros_like(cv)
    write_kv(rk, rv, want_k, v, slots)
    torch.testing.assert_close(q_out, want_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(ck, rk, atol=1e-5, rtol=0)
    assert torch.equal(cv, rv)


@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_add_rms_norm_matches_torch(kernels, with_residual):
    from hybridrl.models.llama import RMSNorm
    from hybridrl.models.triton_ops import fused_add_rms_norm

    torch.manual_seed(0)
    norm = RMSNorm(48, 1e-6).to(KDEV)
    with torch.no_grad():
        norm.weight.normal_()
    res, delta = torch.randn(3, 5, 48, device=KDEV), torch.randn(3, 5, 48, device=KDEV)
    got_res, got = fused_add_rms_norm(res if with_residual else None, delta, norm.weight, 1e-6)
    want_res = res + delta if with_residual else delta
    torch.testing.assert_close(got_res, want_res)
    torch.testing.assert_close(got, norm(want_res), atol=1e-5, rtol=1e-5)


def test_triton_silu_mul_matches_torch(kernels):
    from hybridrl.models.triton_ops import silu_mul

    gate_up = torch.randn(3, 2, 2 * 1500, device=KDEV)  # two column tiles
    g, u = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), torch.nn.functional.silu(g) * u, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("joint", [True, False])
def test_triton_prefill_attention_matches_torch_path(kernels, joint):
    """The fused prefill (one rope+store kernel for q and k of every token, padding to the scratch
    block) gives the torch path's attention output and cache contents; `joint`: q/k/v are views of
    one fused-projection buffer (the kernel reads q and k heads in place), else separate tensors."""
    from transformers import Qwen2Config

    from hybridrl.models.llama import rope_tables
    from hybridrl.rollout.native.attention import PrefillAttention
    from hybridrl.rollout.native.cache import KVCache

    torch.manual_seed(0)
    H, n_kv, D, bs, lens = 4, 2, 16, 4, (7, 3, 5)
    B, T = len(lens), max(lens)
    tables = rope_tables(Qwen2Config(rope_theta=10000.0), D, 32)
    tables = tuple(t.to(KDEV) for t in tables)
    qkv = torch.randn(B, T, (H + 2 * n_kv) * D, device=KDEV)
    q, k, v = (x.view(B, T, -1, D) for x in qkv.split([H * D, n_kv * D, n_kv * D], -1))
    if not joint:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    from hybridrl.rollout.native.attention import _joint_heads

    assert (_joint_heads(q, k).data_ptr() == q.data_ptr()) == joint  # a view of the buffer, or a copy
    torch.testing.assert_close(_joint_heads(q, k), torch.cat([q, k], 2))
    # tokens of sequence i go to blocks 1 + 2i, 2 + 2i (block 0 is scratch)
    slots = torch.tensor([(1 + 2 * i) * bs + t for i, n in enumerate(lens) for t in range(n)], device=KDEV)
    valid = torch.tensor([i * T + t for i, n in enumerate(lens) for t in range(n)], device=KDEV)
    caches, outs = [], []
    for kern in (None, kernels):
        cache = KVCache(1, 1 + 2 * B, bs, n_kv, D, torch.float32, KDEV)
        attn = PrefillAttention(cache, slots, valid, kern, tables)
        cos = tables[0][torch.arange(T, device=KDEV)].expand(B, T, D).unsqueeze(2)
        sin = tables[1][torch.arange(T, device=KDEV)].expand(B, T, D).unsqueeze(2)
        outs.append(attn(0, q, k, v, None if kern else cos, None if kern else sin))
        caches.append(cache)
    m = torch.zeros(B, T, dtype=torch.bool)
    for i, n in enumerate(lens):
        m[i, :n] = True
    torch.testing.assert_close(outs[1][m], outs[0][m], atol=1e-5, rtol=0)  # padded rows are never read
    for get in (KVCache.k, KVCache.v):  # all real blocks equal; only the scratch block may differ
        torch.testing.assert_close(get(caches[1], 0)[1:], get(caches[0], 0)[1:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("H, n_kv, D, bs, lens", [(4, 2, 16, 4, (5, 70, 1, 33)), (14, 2, 32, 16, (17, 2, 40))])
def test_triton_fused_rope_paged_decode_matches_two_step_path(kernels, H, n_kv, D, bs, lens):
    """rope + K/V store + paged attention in one kernel (the new token's term from registers) equals
    rope_and_store then the paged reference over the updated cache; the cache ends up the same."""
    from transformers import Qwen2Config

    from hybridrl.models.llama import rope_tables

    q0, ck, cv, tables, ctx = (a.to(KDEV) for a in paged_setup(H=H, n_kv=n_kv, D=D, bs=bs, lens=lens, B=len(lens)))
    torch.manual_seed(1)
    B = len(lens)
    qkv = torch.randn(B, (H + 2 * n_kv) * D, device=KDEV)  # one buffer, as the fused projection gives
    q, k, v = (x.view(B, -1, D) for x in qkv.split([H * D, n_kv * D, n_kv * D], -1))
    pos = ctx.long() - 1  # the new token is the last of each context
    slots = tables.long().gather(1, (pos // bs)[:, None])[:, 0] * bs + pos % bs
    cos, sin = (t.to(KDEV) for t in rope_tables(Qwen2Config(rope_theta=10000.0), D, 128))
    ck2, cv2 = ck.clone(), cv.clone()
    q_rot = kernels.rope_and_store(q, k, v, cos, sin, pos, slots, ck2, cv2)
    want = paged_decode_reference(q_rot, ck2, cv2, tables, ctx)
    got = kernels.rope_paged_decode(q, k, v, cos, sin, pos, slots, ck, cv, tables, ctx)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    torch.testing.assert_close(ck, ck2, atol=1e-6, rtol=0)
    assert torch.equal(cv, cv2)
