"""Masked reductions over padded (B, T) token tensors.

`mask` is 1 on tokens that count (response tokens) and 0 on padding; bool masks are accepted.
Empty masks give 0 rather than NaN, so one all-padding micro-batch cannot poison a step.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * mask) over `dim` (all elements when None)."""
    masked = x * mask.to(x.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(x * mask) / sum(mask) over `dim`; 0 where the mask is empty."""
    count = mask.to(x.dtype)
    count = count.sum() if dim is None else count.sum(dim=dim)
    # clamp instead of "+ eps": exact for non-empty masks, and 0 / eps = 0 for empty ones.
    return masked_sum(x, mask, dim) / count.clamp_min(WHITEN_EPS)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements: mean((x - mean)^2), times n / (n - 1) if unbiased.

    With fewer than two valid elements the Bessel factor is undefined; the biased value is
    returned instead (0 for a single element) so the result stays finite without a host sync.
    """
    centered = x - masked_mean(x, mask)
    var = masked_mean(centered * centered, mask)
    if unbiased:
        n = mask.to(x.dtype).sum()
        bessel = torch.where(n > 1, n / (n - 1).clamp_min(1.0), torch.ones_like(n))
        var = var * bessel
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / sqrt(var + 1e-8) with masked mean and (unbiased) variance.

    With shift_mean=False the mean is added back: only the scale is normalised.
    """
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean
