"""KL between the policy and the frozen reference: per-token estimators and the coefficient.

The estimators use samples from the policy, so logp - ref (k1) is an unbiased but noisy
estimate of KL(pi || ref); k2 and k3 trade a little bias (k2) or none (k3) for lower variance
(Schulman, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html).
"""

from __future__ import annotations

from typing import Any

import torch

from hybridrl.algorithms.core import masked_mean
from hybridrl.config.names import KL_ESTIMATORS

KL_TYPES = KL_ESTIMATORS  # the names are defined once, in the torch-free config layer


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token KL estimate, same shape as the inputs. With d = logp - ref:

    kl, k1:          d
    abs:             |d|
    mse, k2:         d^2 / 2
    low_var_kl, k3:  exp(-d) + d - 1, clamped to [-10, 10]
    """
    if kl_type not in KL_TYPES:
        raise ValueError(f"unknown kl_type {kl_type!r}; known: {KL_TYPES}")
    diff = log_prob - ref_log_prob
    if kl_type in ("kl", "k1"):
        return diff
    if kl_type == "abs":
        return diff.abs()
    if kl_type in ("mse", "k2"):
        return 0.5 * diff.square()
    # k3 = r - log r - 1 with r = ref / pi: non-negative and unbiased. Clamping log r before exp
    # keeps the backward pass finite (a clamp after an overflowed exp gives 0 * inf = NaN).
    log_r = (-diff).clamp(-20.0, 20.0)
    return (torch.exp(log_r) - log_r - 1).clamp(-10.0, 10.0)


class FixedKLController:
    """Constant KL coefficient."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the observed KL towards `target_kl`
    (Ziegler et al. 2019, arXiv 1909.08593, section 2.2):

        e      = clip(KL / target - 1, -0.2, 0.2)
        beta  *= 1 + e * n_steps / horizon
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"target_kl and horizon must be > 0, got {target_kl}, {horizon}")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale the coefficient after `n_steps` samples with mean KL `current_kl`."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


def make_kl_controller(
    type: str, kl_coef: float, target_kl: float = 0.1, horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """Build the controller named by `type` ("fixed" or "adaptive"); defaults match verl's."""
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown kl controller type {type!r}; known: ('fixed', 'adaptive')")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_type: str,
) -> tuple[torch.Tensor, float]:
    """KL-in-reward (Ziegler et al. 2019): r_t = score_t - beta * KL_t on response tokens.

    Returns the (B, T) rewards and current_kl, the batch mean of each sequence's masked mean
    KL (a Python float, for the adaptive controller and logging).
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = kl_penalty(log_prob, ref_log_prob, kl_type) * mask  # (B, T)
    rewards = token_level_scores - kl_coef * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean().item()
    return rewards, current_kl
