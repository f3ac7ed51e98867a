"""The sampler's noise is finite and exact for every hash value, and improbable tokens are never
drawn at a real vocabulary size (issue 39: u rounded to 1.0 for one hash value in 2**24, so one
vocabulary entry in 2**24 got +inf noise: a uniformly random token in ~0.9% of draws at 151,936).

The tests reach the noise through `gumbel_noise(keys, ...)` with keys chosen by inverting the
hash, so they exercise the public function and ran against the code before the fix too."""

import math
from statistics import NormalDist

import pytest
import torch
from sampler_stats import chi_square_limit, chi_square_stat, unmix32

from hybridrl.rollout.native.sampling import MASK32, gumbel_noise, mix32, sample

QWEN_VOCAB = 151_936  # Qwen2.5's embedding rows (its tokenizer has 151,665 entries)


def test_unmix32_inverts_the_hash():
    x = torch.randint(0, 1 << 32, (10_000,), dtype=torch.int64)
    assert torch.equal(mix32(unmix32(x)), x)


def _noise_of_hashes(h: torch.Tensor) -> torch.Tensor:
    """The noise `gumbel_noise` gives vocabulary entry 0 of a row whose hash there is h."""
    return gumbel_noise(unmix32(h), 1)[:, 0]


def test_noise_is_finite_monotone_and_exact_for_every_hash_value():
    # The noise depends on the hash only through its top 24 bits k = h >> 8: all 2**24 of them.
    # Its range in float64: u in [2**-25, 1 - 2**-24] gives -log(-log u) in [-2.8526, 16.6355].
    lo, hi = -log_neg_log(2.0**-25) - 1e-5, -log_neg_log(1 - 2.0**-24) + 1e-5
    prev_last = -math.inf
    for start in range(0, 1 << 24, 1 << 22):
        k = torch.arange(start, start + (1 << 22), dtype=torch.int64)
        g = _noise_of_hashes((k << 8) | 0x5A)
        assert torch.isfinite(g).all()
        assert float(g.min()) >= lo and float(g.max()) <= hi
        # u grows with k, so E = -log u falls and the noise -log E rises
        assert bool((g[1:] >= g[:-1]).all()) and float(g[0]) >= prev_last
        prev_last = float(g[-1])
        # against float64 from the same float32 u (the uniform the sampler defines)
        u = (((k.float() + 0.5) * (1.0 / (1 << 24))).clamp(max=1 - 2.0**-24)).double()
        ref = -torch.log(-torch.log(u))
        # -log E has absolute error ~ the relative error of E: float32 rounding, a few 1e-8
        assert float((g.double() - ref).abs().max()) < 1e-6
    # a token more than hi - lo (19.49) below the top logit can never be drawn, whatever the hash
    assert hi - lo < 19.5


def log_neg_log(u: float) -> float:
    return math.log(-math.log(u))


def test_noise_bounds_are_the_extremes():
    from hybridrl.rollout.native.sampling import noise_bounds

    lo, hi = noise_bounds()
    assert lo == pytest.approx(-log_neg_log(2.0**-25), abs=1e-5)
    assert hi == pytest.approx(-log_neg_log(1 - 2.0**-24), abs=1e-5)


def test_the_largest_hash_values_near_u_equal_1():
    # the values that once gave u == 1.0 (+inf) and their neighbours: the noise of the last
    # representable u's, in float64, is -log(-log(1 - 2**-24)) = 16.6355...
    h = torch.tensor([MASK32, MASK32 - 0xFF, MASK32 - 0x100, MASK32 - 0x200], dtype=torch.int64)
    g = _noise_of_hashes(h).double()
    assert torch.isfinite(g).all()
    assert abs(float(g[0]) - (-math.log(-math.log1p(-(2.0**-24))))) < 1e-6


@pytest.mark.parametrize("temperature, top_k, top_p, rows", [(1.0, -1, 1.0, 1024), (0.6, 50, 0.9, 128)])
def test_peaked_distribution_at_a_real_vocabulary_never_draws_an_improbable_token(temperature, top_k, top_p, rows):
    # one token at +30, every other at 0: each other token has p ~ 9e-14. The code before the
    # fix drew a wrong token in ~0.9% of these draws (~9 of 1,024: P(none) ~ 1e-4). tests/gpu
    # draws 10^7 per path and temperature; here the CPU does what CI affords.
    gen = torch.Generator().manual_seed(1234)
    best = torch.randint(0, QWEN_VOCAB, (rows,), generator=gen)
    logits = torch.zeros(rows, QWEN_VOCAB)
    logits[torch.arange(rows), best] = 30.0
    seeds = torch.randint(0, 1 << 62, (rows,), generator=gen)
    wrong = 0
    for lo in range(0, rows, 128):
        sl = slice(lo, lo + 128)
        tokens, lps = sample(logits[sl], seeds[sl], torch.full((len(best[sl]),), 100), temperature, top_k, top_p)
        wrong += int((tokens != best[sl]).sum())
        assert torch.isfinite(lps).all()
    assert wrong == 0


def test_ids_past_the_tokenizer_are_never_drawn():
    gen = torch.Generator().manual_seed(7)
    V, limit, rows = 1000, 900, 512
    logits = torch.randn(rows, V, generator=gen)
    logits[:, limit:] += 6.0  # the padding rows would win most draws
    seeds = torch.randint(0, 1 << 62, (rows,), generator=gen)
    x = logits / 0.8
    for temperature in (0.0, 0.8):
        tokens, lps = sample(logits, seeds, torch.arange(rows), temperature, vocab_limit=limit)
        assert int(tokens.max()) < limit
        want = (logits if temperature == 0 else x).log_softmax(-1).gather(-1, tokens[:, None])[:, 0]
        torch.testing.assert_close(lps, want, atol=1e-5, rtol=0)  # the full-vocabulary normalizer
    tokens, _ = sample(logits, seeds, torch.arange(rows), 1.0, top_k=950, vocab_limit=limit)
    assert int(tokens.max()) < limit


def test_draws_follow_softmax_chi_square():
    # 60,000 draws from three rows of 500 logits at the scale of a real model's (a few confident
    # tokens, a long tail): the counts agree with softmax(logits / T) by a chi-square test whose
    # limit is the (1 - 1e-6) quantile of its distribution (derived, not tuned). tests/gpu draws
    # 10^6 from a real model's logits.
    gen = torch.Generator().manual_seed(11)
    V, T = 500, 0.8
    base = torch.randn(3, V, generator=gen) * 2.5
    base[:, :5] += torch.tensor([9.0, 8.0, 7.5, 6.0, 5.0])
    per_row = 20_000
    for r in range(3):
        seeds = torch.randint(0, 1 << 62, (per_row,), generator=gen)
        tok, _ = sample(base[r].expand(per_row, V), seeds, torch.full((per_row,), 5), T)
        probs = torch.softmax(base[r].double() / T, -1)
        stat, dof = chi_square_stat(torch.bincount(tok, minlength=V), probs)
        assert stat < chi_square_limit(dof, alpha=1e-6), (r, stat, dof)


def test_chi_square_limit_matches_known_quantiles():
    # Wilson-Hilferty against tabulated chi-square quantiles (alpha = 0.001): 10 dof 29.59, 100 dof 149.45
    assert abs(chi_square_limit(10, 0.001) - 29.59) < 0.3
    assert abs(chi_square_limit(100, 0.001) - 149.45) < 0.5
    assert NormalDist().inv_cdf(1 - 1e-6) == pytest.approx(4.7534, abs=1e-3)


def test_a_sampler_with_one_inf_noise_value_fails_the_statistics():
    # The chi-square test is not blind to the bug it exists for: mix 1% uniform draws into exact ones.
    gen = torch.Generator().manual_seed(3)
    V = 500
    probs = torch.softmax(torch.randn(V, generator=gen, dtype=torch.float64) * 2.5, -1)
    n = 60_000
    exact = torch.multinomial(probs.float(), n, replacement=True, generator=gen)
    stray = torch.randint(0, V, (n,), generator=gen)
    broken = torch.where(torch.rand(n, generator=gen) < 0.009, stray, exact)
    stat_ok, dof_ok = chi_square_stat(torch.bincount(exact, minlength=V), probs)
    stat_bad, dof_bad = chi_square_stat(torch.bincount(broken, minlength=V), probs)
    assert stat_ok < chi_square_limit(dof_ok, 1e-6) < stat_bad
