"""Token-level losses for the actor and critic, and how they are reduced to a scalar.

Gradient accumulation: pass `global_tokens` / `global_seqs`, the token and sequence counts of the
whole mini-batch, to every micro-batch call. The denominators then no longer depend on how the
mini-batch was split, so the sum of the micro-batch losses equals the whole mini-batch loss
(value and gradient) for every mode. Metrics (clip fractions, ppo_kl) stay micro-batch means;
they are 0-dim detached tensors, for the caller to average.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.core import masked_mean, masked_sum

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

Count = int | float | torch.Tensor


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar. With N = tokens, S = sequences:

        token-mean:              sum_{i,t} m l / N
        seq-mean-token-sum:      sum_i (sum_t m l) / S
        seq-mean-token-mean:     sum_i (sum_t m l / sum_t m) / S     (empty rows contribute 0)
        seq-mean-token-sum-norm: sum_{i,t} m l / (S * T)             (T = loss_mask.shape[-1])

    N and S are this batch's counts unless `global_tokens` / `global_seqs` are given. The
    "-norm" mode divides by the padded horizon T (Dr. GRPO, arXiv 2503.20783, removes the
    length bias this way), so under gradient accumulation every micro-batch must be padded to
    the same T for the sum over micro-batches to match the whole batch.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; known: {LOSS_AGG_MODES}")
    mask = loss_mask.to(loss_mat.dtype)
    num_seqs = loss_mat.shape[0] if global_seqs is None else global_seqs
    if loss_agg_mode == "token-mean":
        # clamp: an all-padding batch gives 0, not NaN.
        num_tokens = mask.sum().clamp_min(1) if global_tokens is None else global_tokens
        return masked_sum(loss_mat, mask) / num_tokens
    seq_sums = masked_sum(loss_mat, mask, dim=-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.sum() / num_seqs
    if loss_agg_mode == "seq-mean-token-mean":
        seq_means = seq_sums / mask.sum(dim=-1).clamp_min(1)  # (B,)
        return seq_means.sum() / num_seqs
    return seq_sums.sum() / (num_seqs * loss_mask.shape[-1])


def compute_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """PPO clipped surrogate (Schulman et al. 2017) with asymmetric clip and dual-clip.

        r    = exp(clamp(logp - logp_old, -20, 20))
        L    = max(-A r, -A clip(r, 1 - low, 1 + high))
        L    = min(L, -A c)   where A < 0                      (dual-clip)

    Asymmetric bounds ("clip-higher") are from DAPO (arXiv 2503.14476). Dual-clip (Ye et al.
    2020, arXiv 1912.09729) bounds the loss of a negative-advantage token whose ratio has run
    far above 1, where plain PPO's max would be unbounded.

    Returns pg_loss (differentiable scalar) and the detached 0-dim metrics pg_clipfrac (share
    of tokens where the clipped term is the larger), pg_clipfrac_lower (share where dual-clip
    binds) and ppo_kl (masked mean of logp_old - logp, on the clamped difference).
    `rollout_is_weights` (B, T), when given, multiplies the per-token losses before they are
    reduced (train/rollout mismatch correction, `algorithms/rollout_correction.py`).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip, got {clip_ratio_c}")
    # Clamp before exp: a stale or -inf log-prob must not overflow the ratio.
    log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0)  # (B, T)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_dual), loss_ppo)  # (B, T)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights

    counts = {"global_tokens": global_tokens, "global_seqs": global_seqs}
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **counts)
    with torch.no_grad():
        clipped = loss_clipped > loss_unclipped
        dual_clipped = negative & (loss_ppo > loss_dual)
        clipfrac = masked_mean(clipped.to(ratio.dtype), response_mask)
        clipfrac_lower = masked_mean(dual_clipped.to(ratio.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return {
        "pg_loss": pg_loss,
        "pg_clipfrac": clipfrac,
        "pg_clipfrac_lower": clipfrac_lower,
        "ppo_kl": ppo_kl,
    }


def compute_value_loss(
    *,
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
) -> dict[str, torch.Tensor]:
    """Clipped value loss, as in PPO implementations since OpenAI baselines:

        V_clip  = V_old + clamp(V - V_old, -c, c)
        vf_loss = 0.5 * agg(max((V - R)^2, (V_clip - R)^2))

    Returns vf_loss (differentiable scalar) and vf_clipfrac (detached 0-dim: share of tokens
    where the clipped error is the larger).
    """
    vpreds_clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    err_unclipped = (vpreds - returns) ** 2  # (B, T)
    err_clipped = (vpreds_clipped - returns) ** 2  # (B, T)
    vf_losses = torch.maximum(err_unclipped, err_clipped)
    counts = {"global_tokens": global_tokens, "global_seqs": global_seqs}
    vf_loss = 0.5 * agg_loss(vf_losses, response_mask, loss_agg_mode, **counts)
    with torch.no_grad():
        clipfrac = masked_mean((err_clipped > err_unclipped).to(vpreds.dtype), response_mask)
    return {"vf_loss": vf_loss, "vf_clipfrac": clipfrac}


def compute_entropy_loss(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
) -> torch.Tensor:
    """agg(entropy) over response tokens; the caller subtracts entropy_coeff times it."""
    counts = {"global_tokens": global_tokens, "global_seqs": global_seqs}
    return agg_loss(entropy, response_mask, loss_agg_mode, **counts)
