"""Helpers for the sampler's statistical tests (tests/rollout/test_sampler_exact.py, tests/gpu/test_sampler_gpu.py)."""

from __future__ import annotations

from statistics import NormalDist

import torch

_MUL_INV = pow(0x45D9F3B, -1, 1 << 32)  # the hash multiplier's inverse mod 2**32
_MASK32 = 0xFFFFFFFF


def unmix32(h: torch.Tensor) -> torch.Tensor:
    """The inverse of `sampling.mix32` (each step is a bijection on 32 bits): the key whose hash is h."""
    x = (h >> 16) ^ h  # an xor-shift by 16 of a 32-bit value is its own inverse
    x = x * _MUL_INV & _MASK32
    x = (x >> 16) ^ x
    x = x * _MUL_INV & _MASK32
    return (x >> 16) ^ x


def chi_square_stat(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson's statistic of observed `counts` (V,) against `probs` (V,): the tokens expected at
    least `min_expected` times are their own bins, all the others one pooled bin (so stray draws
    of improbable tokens land there). Returns (statistic, degrees of freedom)."""
    n = int(counts.sum())
    expected = probs.double().cpu() * n
    counts = counts.double().cpu()
    own = expected >= min_expected
    obs = torch.cat([counts[own], counts[~own].sum()[None]])
    exp = torch.cat([expected[own], expected[~own].sum()[None]])
    if float(exp[-1]) < min_expected:  # too little pooled mass to be a bin: fold it into the largest
        big = int(exp[:-1].argmax())
        obs[big] += obs[-1]
        exp[big] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, len(obs) - 1


def chi_square_limit(dof: int, alpha: float) -> float:
    """The (1 - alpha) quantile of the chi-square distribution with `dof` degrees of freedom
    (Wilson-Hilferty: (X / dof)^(1/3) is close to normal with mean 1 - 2/(9 dof), variance 2/(9 dof))."""
    z = NormalDist().inv_cdf(1 - alpha)
    c = 2.0 / (9.0 * dof)
    return dof * (1 - c + z * c**0.5) ** 3
