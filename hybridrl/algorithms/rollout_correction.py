"""Train/rollout mismatch correction (config `algorithm.rollout_correction`, verl's names).

The rollout engine samples with its own kernels and precision, so the log-probs it reports
(`rollout_log_probs`) differ from the trainer's recomputation of the same policy
(`old_log_probs`). PPO's ratio is taken against the trainer's numbers, but the samples came from
the engine's distribution; this module measures the gap and corrects for it with

- truncated importance sampling (TIS): a weight w = min(pi_old / pi_rollout, threshold) per
  token (`rollout_is=token`) or per sequence (`sequence`: the product over its tokens), which
  the policy loss multiplies into its per-token terms;
- rejection sampling (RS): tokens or whole sequences whose divergence falls outside a bound are
  dropped from the response mask (`rollout_rs`, a comma-separated list of criteria that must
  all pass).

See Yao et al., "Your efficient RL framework secretly brings you off-policy RL training" (2025)
and Liu et al., "When speed kills stability" (2025); docs/algorithms.md has the formulas.
Everything here is a pure function of tensors; metrics come back as floats named as verl
names them (`rollout_corr/...`).
"""

from __future__ import annotations

import math

import torch

from hybridrl.algorithms.core import masked_mean, masked_sum
from hybridrl.config.names import ROLLOUT_IS_LEVELS, ROLLOUT_RS_OPTIONS

# A sampled token whose probability under the trainer (at the sampling temperature) is below this
# is one the policy would essentially never write there: a correct sampler draws about
# (tokens x IMPROBABLE_P) of them; one whose noise can be +inf draws ~1% of all tokens.
IMPROBABLE_P = 1e-6


def improbable_token_frac(log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Share of the response tokens (mask 1) whose trainer log-prob is below log(IMPROBABLE_P); 0-d."""
    hits = (log_probs.detach() < math.log(IMPROBABLE_P)).to(mask.dtype) * mask
    return hits.sum() / mask.sum().clamp(min=1)


# exp() bound on log-ratios (exp(20) ~ 5e8), as verl's SAFETY_BOUND
_BOUND = 20.0


def parse_rs_options(rollout_rs: str) -> list[str]:
    """'token_k1, seq_mean_k3' -> ['token_k1', 'seq_mean_k3'] (duplicates dropped); unknown names raise."""
    options = list(dict.fromkeys(o.strip() for o in str(rollout_rs).split(",") if o.strip()))
    bad = [o for o in options if o not in ROLLOUT_RS_OPTIONS]
    if not options or bad:
        raise ValueError(f"rollout_rs={rollout_rs!r}: each entry must be one of {', '.join(ROLLOUT_RS_OPTIONS)}")
    return options


def parse_rs_thresholds(options: list[str], spec) -> dict[str, tuple[float | None, float]]:
    """Per option (lower, upper) bounds from `rollout_rs_threshold`.

    One entry per option, comma-separated, or a single entry shared by all. k1 options take
    "lower_upper" (e.g. "0.5_2.0") or one number u meaning [1/u, u]: they keep
    lower <= exp(k1-statistic) <= upper, where k1 = log(pi_rollout / pi_old) (as verl's code
    does). k2/k3 options take one positive upper bound.
    """
    if spec is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold (e.g. 2.0, or 0.5_2.0 for a k1 option)")
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) == 1:
        parts = parts * len(options)
    if len(parts) != len(options):
        raise ValueError(f"rollout_rs_threshold={spec!r} gives {len(parts)} values for {len(options)} rollout_rs options")
    out = {}
    for option, part in zip(options, parts):
        try:
            if option.endswith("k1"):
                lower, upper = (float(x) for x in part.split("_", 1)) if "_" in part else (1 / float(part), float(part))
            elif "_" in part:
                raise ValueError
            else:
                lower, upper = None, float(part)
        except (ValueError, ZeroDivisionError):
            raise ValueError(
                f"rollout_rs_threshold {part!r} for {option}: use a positive number" + (" or lower_upper" * option.endswith("k1"))
            ) from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: bounds must be > 0")
        if lower is not None and lower > upper:
            raise ValueError(f"rollout_rs_threshold {part!r} for {option}: the lower bound is above the upper one")
        out[option] = (lower, upper)
    return out


def _seq_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over each row's masked entries; 0 for an empty row. (B,)"""
    top = x.masked_fill(mask <= 0, -torch.inf).max(dim=-1).values
    return torch.where(torch.isinf(top), torch.zeros_like(top), top)


def _fraction(keep_tokens: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(share of masked tokens dropped, share of non-empty sequences with any token dropped)."""
    dropped = (~keep_tokens) & (mask > 0)  # (B, T)
    rows = mask.sum(-1) > 0
    seq = dropped.any(-1)[rows].to(mask.dtype).mean() if rows.any() else mask.new_zeros(())
    return masked_mean(dropped.to(mask.dtype), mask).item(), seq.item()


def rejection_mask(log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_rs: str, rollout_rs_threshold):
    """Keep mask (B, T) bool after every `rollout_rs` criterion, and its metrics (no prefix).

    With lr = log(pi_old / pi_rollout) per token, the divergences are
        k1 = -lr,   k2 = lr^2 / 2,   k3 = exp(lr) - 1 - lr
    token_kX judges each token; seq_sum_kX / seq_mean_kX / seq_max_kX judge the sum / mean / max
    over a sequence and keep or drop all of its tokens. k1 criteria keep
    log(lower) <= statistic <= log(upper); k2/k3 keep statistic <= upper.
    seq_mean_k1 bounds the geometric mean of the sequence's ratios (verl's former
    "geometric" level).
    """
    options = parse_rs_options(rollout_rs)
    bounds = parse_rs_thresholds(options, rollout_rs_threshold)
    mask = response_mask.to(log_ratio.dtype)
    lr = log_ratio.clamp(-_BOUND, _BOUND)
    stats = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}  # (B, T) each
    keep = response_mask > 0
    metrics: dict[str, float] = {}
    for option in options:
        level, kind = option.rsplit("_", 1)
        token_stat = stats[kind]
        if level == "token":
            stat = token_stat  # (B, T)
        elif level == "seq_sum":
            stat = masked_sum(token_stat, mask, dim=-1)[:, None]  # (B, 1)
        elif level == "seq_mean":
            stat = masked_mean(token_stat, mask, dim=-1)[:, None]
        else:
            stat = _seq_max(token_stat, mask)[:, None]
        lower, upper = bounds[option]
        if kind == "k1":
            ok = (stat >= math.log(lower)) & (stat <= math.log(upper))
        else:
            ok = stat <= upper
        ok = ok.expand_as(keep)
        keep = keep & ok
        stat_tokens = stat.expand_as(mask)
        metrics[f"rollout_rs_{option}_mean"] = masked_mean(stat_tokens, mask).item()
        metrics[f"rollout_rs_{option}_max"] = stat_tokens.masked_fill(mask <= 0, -torch.inf).max().item()
        metrics[f"rollout_rs_{option}_min"] = stat_tokens.masked_fill(mask <= 0, torch.inf).min().item()
        token_frac, seq_frac = _fraction(ok, mask)
        metrics[f"rollout_rs_{option}_masked_fraction"] = token_frac
        metrics[f"rollout_rs_{option}_seq_masked_fraction"] = seq_frac
    token_frac, seq_frac = _fraction(keep, mask)
    metrics["rollout_rs_masked_fraction"] = token_frac
    metrics["rollout_rs_seq_masked_fraction"] = seq_frac
    return keep, metrics


def importance_weights(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rollout_is: str, threshold: float, batch_normalize: bool = False
):
    """Truncated IS weights (B, T), 0 on padding, detached, and their metrics (no prefix).

        token:    w_t = min(exp(lr_t), threshold)
        sequence: w_t = min(exp(sum_t' lr_t'), threshold)   for every token of the sequence

    batch_normalize divides by the weights' mean (over tokens, or over sequences) so they
    average 1. Metrics are taken before truncation: rollout_is_mean/max/min,
    rollout_is_ratio_fraction_high/low (share above threshold / below 1/threshold),
    rollout_is_eff_sample_size = 1 / mean(w_n^2) with w_n the weights clamped to
    [1/threshold, threshold] and scaled to mean 1.
    """
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={rollout_is!r} must be one of {', '.join(ROLLOUT_IS_LEVELS)} (or null = off)")
    if threshold <= 0:
        raise ValueError(f"rollout_is_threshold must be > 0, got {threshold}")
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "token":
        level_log_ratio = log_ratio
    else:
        level_log_ratio = masked_sum(log_ratio, mask, dim=-1)[:, None].expand_as(log_ratio)
    raw = torch.exp(level_log_ratio.clamp(-_BOUND, _BOUND)) * mask  # (B, T)
    valid = mask > 0
    # fractions over tokens (token level) or over sequences (sequence level)
    if rollout_is == "token":
        units = (level_log_ratio, mask)
    else:
        units = (level_log_ratio[:, :1], (mask.sum(-1, keepdim=True) > 0).to(mask.dtype))
    metrics = {
        "rollout_is_mean": masked_mean(raw, mask).item(),
        "rollout_is_max": raw.masked_fill(~valid, -torch.inf).max().item(),
        "rollout_is_min": raw.masked_fill(~valid, torch.inf).min().item(),
        "rollout_is_ratio_fraction_high": masked_mean((units[0] > math.log(threshold)).to(mask.dtype), units[1]).item(),
        "rollout_is_ratio_fraction_low": masked_mean((units[0] < -math.log(threshold)).to(mask.dtype), units[1]).item(),
    }
    clamped = raw.clamp(1.0 / threshold, threshold)
    normed = clamped / (masked_mean(clamped, mask) + 1e-8)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normed**2, mask).item()
    metrics["rollout_is_seq_mean"] = masked_mean(raw, mask, dim=-1)[mask.sum(-1) > 0].mean().item()
    weights = raw.clamp(max=threshold).detach()
    if batch_normalize:
        if rollout_is == "token":
            mean = masked_mean(weights, mask)
        else:
            rows = mask.sum(-1) > 0
            mean = masked_mean(weights, mask, dim=-1)[rows].mean()
        factor = mean.item() if mean.item() > 1e-8 else 1.0
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def mismatch_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """How far the engine's distribution is from the trainer's (no prefix).

    kl = mean(logp_rollout - logp_old) (KL(rollout || old), k1), k3_kl = mean(r - 1 - log r) with
    r = pi_old / pi_rollout; training_ppl / rollout_ppl = batch mean of each sequence's
    exp(-mean logp); log_ppl_diff = mean over sequences of (mean logp_rollout - mean logp_old);
    chi2_token = mean(r^2) - 1; chi2_seq = mean over sequences of (prod r)^2 - 1.
    """
    mask = response_mask.to(old_log_prob.dtype)
    rows = mask.sum(-1) > 0
    lr = old_log_prob - rollout_log_prob  # (B, T)
    lr_safe = lr.clamp(-_BOUND, _BOUND)
    mean_old = masked_mean(old_log_prob, mask, dim=-1)[rows]  # (B',)
    mean_rollout = masked_mean(rollout_log_prob, mask, dim=-1)[rows]
    seq_lr = masked_sum(lr, mask, dim=-1)[rows].clamp(-_BOUND, _BOUND)
    return {
        "kl": masked_mean(-lr, mask).item(),
        "k3_kl": masked_mean(torch.exp(lr_safe) - lr_safe - 1, mask).item(),
        "training_ppl": torch.exp(-mean_old).mean().item(),
        "rollout_ppl": torch.exp(-mean_rollout).mean().item(),
        "log_ppl_diff": (mean_rollout - mean_old).mean().item(),
        "chi2_token": (masked_mean(torch.exp(2 * lr_safe), mask) - 1).item(),
        "chi2_seq": (torch.exp(2 * seq_lr).mean() - 1).item(),
    }


def compute_rollout_correction(
    *,
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold=None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """(IS weights (B, T) or None, the response mask after rejection (B, T), metrics).

    The ratio is pi_old / pi_rollout, from the trainer's `old_log_prob` and the engine's
    `rollout_log_prob`. With both `rollout_is` and `rollout_rs` null, only the mismatch metrics
    are computed (verl does the same: monitor first, then correct). Metric names carry the
    `rollout_corr/` prefix. The returned mask has the dtype of `response_mask`.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob {tuple(rollout_log_prob.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have the same shape"
        )
    log_ratio = old_log_prob - rollout_log_prob  # (B, T) log(pi_old / pi_rollout)
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None:
        weights, m = importance_weights(log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize)
        metrics.update(m)
    mask = response_mask
    if rollout_rs is not None:
        keep, m = rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        mask = response_mask * keep.to(response_mask.dtype)
        metrics.update(m)
    metrics.update(mismatch_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{k}": v for k, v in metrics.items()}
