"""Policy losses, registered by name (config key `actor_rollout_ref.actor.policy_loss.loss_mode`).

Every policy loss is called with the same keywords and returns a dict of 0-dim tensors:

    fn(*, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
       global_tokens=None, global_seqs=None, rollout_is_weights=None)
    -> {"pg_loss": differentiable, "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl": detached, ...}

All tensors are (B, T) over response tokens. `config` is the actor config: `clip_ratio_low`,
`clip_ratio_high`, `clip_ratio_c` and the `policy_loss` section (`clip_cov_ratio`, ...); it is
read by attribute, so any object with those fields will do. `global_tokens` / `global_seqs`
are the mini-batch counts that make micro-batch losses add up to the mini-batch loss
(`losses.agg_loss`). `rollout_is_weights` (B, T) are the train/rollout mismatch weights of
`rollout_correction.py`: every loss multiplies its per-token (or per-sequence) terms by them.

The formulas, with their papers, are in docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridrl.algorithms.core import masked_mean
from hybridrl.algorithms.losses import Count, agg_loss, compute_policy_loss

PolicyLoss = Callable[..., dict[str, torch.Tensor]]

POLICY_LOSSES: dict[str, PolicyLoss] = {}

# exp() of a log-ratio beyond this overflows float32; every ratio is clamped to it first.
_LOG_RATIO_BOUND = 20.0


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make `fn` available as `get_policy_loss(name)`."""

    def decorator(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES and POLICY_LOSSES[name] is not fn:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss(name: str) -> PolicyLoss:
    """Look up a registered policy loss; unknown names raise ValueError listing the known ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}") from None


def _clip_bounds(config) -> tuple[float, float]:
    """(low, high): clip_ratio_low/high, each falling back to clip_ratio when unset."""
    low = getattr(config, "clip_ratio_low", None)
    high = getattr(config, "clip_ratio_high", None)
    base = getattr(config, "clip_ratio", 0.2)
    return (base if low is None else low), (base if high is None else high)


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)  # (B, T)


def _weighted(losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return losses if rollout_is_weights is None else losses * rollout_is_weights


def _metrics(pg_loss, clipfrac=None, clipfrac_lower=None, ppo_kl=None, **extra) -> dict[str, torch.Tensor]:
    zero = pg_loss.new_zeros(())
    out = {
        "pg_loss": pg_loss,
        "pg_clipfrac": zero if clipfrac is None else clipfrac.detach(),
        "pg_clipfrac_lower": zero if clipfrac_lower is None else clipfrac_lower.detach(),
        "ppo_kl": zero if ppo_kl is None else ppo_kl.detach(),
    }
    out.update({k: v.detach() for k, v in extra.items()})
    return out


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """PPO's clipped surrogate with clip-higher and dual-clip: `losses.compute_policy_loss`."""
    low, high = _clip_bounds(config)
    return compute_policy_loss(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=getattr(config, "clip_ratio_c", 3.0),
        loss_agg_mode=loss_agg_mode,
        global_tokens=global_tokens,
        global_seqs=global_seqs,
        rollout_is_weights=rollout_is_weights,
    )


@register_policy_loss("gspo")
def gspo_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): one importance ratio per sequence.

        s_i   = exp(mean_t (logp - logp_old))                  (the length-normalised ratio)
        s_i,t = sg(s_i) * p_t / sg(p_t)                        (value s_i, gradient of log p_t)
        L     = max(-A s_i,t, -A clip(s_i,t, 1 - low, 1 + high)),  aggregated seq-mean-token-mean

    The aggregation is always seq-mean-token-mean, as the paper and verl do (`loss_agg_mode` is
    ignored); no dual-clip. log s_i,t is clamped at 10 before exp.
    """
    low, high = _clip_bounds(config)
    log_ratio = log_prob - old_log_prob  # (B, T)
    mask = response_mask.to(log_ratio.dtype)
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1)  # (B,)
    log_seq_ratio = (log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]).clamp(max=10.0)  # (B, T)
    ratio = torch.exp(log_seq_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    pg_losses = _weighted(torch.maximum(loss_unclipped, loss_clipped), rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean", global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        clipfrac = masked_mean((loss_clipped > loss_unclipped).to(ratio.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return _metrics(pg_loss, clipfrac, None, ppo_kl)


@register_policy_loss("cispo")
def cispo_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

        L = -sg(clip(r, 1 - low, 1 + high)) * A * logp

    Every token keeps a gradient (through logp); the clipped ratio only scales it. pg_clipfrac
    is the share of tokens whose ratio was clipped.
    """
    low, high = _clip_bounds(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # (B, T)
    clipped_ratio = ratio.clamp(1.0 - low, 1.0 + high).detach()
    pg_losses = _weighted(-clipped_ratio * advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        clipfrac = masked_mean((ratio != clipped_ratio).to(ratio.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return _metrics(pg_loss, clipfrac, None, ppo_kl)


@register_policy_loss("gpg")
def gpg_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """GPG (Chu et al. 2025, arXiv 2504.02546): the plain policy gradient, no ratio, no clip.

        L = -A * logp

    Pair it with algorithm.adv_estimator=gpg. ppo_kl is still reported (logp_old - logp).
    """
    pg_losses = _weighted(-advantages * log_prob, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        ppo_kl = masked_mean(old_log_prob - log_prob, response_mask)
    return _metrics(pg_loss, None, None, ppo_kl)


def _centered_cov(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token (A - mean A) * (logp - mean logp), the means over the masked tokens. (B, T), no grad."""
    a, lp = advantages.detach(), log_prob.detach()
    return (a - masked_mean(a, response_mask)) * (lp - masked_mean(lp, response_mask))


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    The PPO clipped loss (no dual-clip), except that a few tokens whose centered covariance
    c_t = (A_t - mean A) (logp_t - mean logp) lies in (clip_cov_lb, clip_cov_ub) get no gradient:
    at most max(1, int(clip_cov_ratio * tokens)) of them, drawn at random among those tokens that
    PPO's clip did not already stop. Such tokens drive the entropy collapse the paper measures.
    pg_clipfrac is the share of tokens detached this way.
    """
    low, high = _clip_bounds(config)
    pl = config.policy_loss
    if pl.clip_cov_ratio <= 0:
        raise ValueError(f"policy_loss.clip_cov_ratio must be > 0, got {pl.clip_cov_ratio}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # (B, T)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    valid = response_mask > 0
    with torch.no_grad():
        cov = _centered_cov(advantages, log_prob, response_mask)  # (B, T)
        candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > pl.clip_cov_lb) & (cov < pl.clip_cov_ub)
        idx = candidates.flatten().nonzero().squeeze(-1)  # flat indices of the candidate tokens
        budget = max(int(pl.clip_cov_ratio * int(valid.sum())), 1)
        chosen = idx[torch.randperm(len(idx), device=idx.device)[:budget]]
        keep = torch.ones_like(ratio).flatten()
        keep[chosen] = 0.0
        keep = keep.view_as(ratio)  # (B, T) 0 on the detached tokens
    pg_losses = _weighted(torch.maximum(loss_unclipped, loss_clipped) * keep, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        clipfrac = masked_mean((keep == 0).to(ratio.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return _metrics(pg_loss, clipfrac, None, ppo_kl)


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """KL-Cov (Cui et al. 2025, arXiv 2505.22617): no clipping; a KL penalty on the top tokens.

        L_t = -A_t r_t                                   for most tokens
        L_t = -A_t r_t + ppo_kl_coef * |logp_t - logp_old_t|   for the max(1, int(kl_cov_ratio * tokens))
                                                         tokens of largest centered covariance c_t

    ppo_kl reports the masked mean of |logp - logp_old| (the penalised quantity), as verl does.
    """
    pl = config.policy_loss
    if pl.kl_cov_ratio <= 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0, got {pl.kl_cov_ratio}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)  # (B, T)
    abs_kl = log_ratio.abs()
    valid = response_mask > 0
    with torch.no_grad():
        cov = _centered_cov(advantages, log_prob, response_mask).masked_fill(~valid, -torch.inf).flatten()
        n_valid = int(valid.sum())
        penalised = torch.zeros_like(cov)
        if n_valid:
            top = torch.topk(cov, max(1, int(n_valid * pl.kl_cov_ratio))).indices
            penalised[top] = 1.0
        penalised = penalised.view_as(ratio)  # (B, T) 1 on the penalised tokens
    pg_losses = _weighted(-advantages * ratio + pl.ppo_kl_coef * abs_kl * penalised, rollout_is_weights)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs)
    with torch.no_grad():
        ppo_kl = masked_mean(abs_kl, response_mask)
    return _metrics(pg_loss, None, None, ppo_kl)


@register_policy_loss("geo_mean")
def geo_mean_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config,
    global_tokens: Count | None = None,
    global_seqs: Count | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """GMPO, geometric-mean policy optimisation (Zhao et al. 2025, arXiv 2507.20673).

        d_t  = logp_t - logp_old_t;   sgn = sign(A_t)
        d'_t = sgn * min(sgn * d_t, sgn * clamp(d_t, -low, high))      (token-level clip, in log space)
        L_i  = -mean_t(A_t) * exp(mean_t d'_t)                         (one term per sequence)
        pg_loss = sum_i L_i / S

    The ratio is the geometric mean of the token ratios, so one outlier token moves it less than
    it moves the arithmetic mean. S is the sequence count (global_seqs); `loss_agg_mode` is not
    used. With rollout_is_weights, each sequence is weighted by the geometric mean of its
    tokens' weights. pg_clipfrac / pg_clipfrac_lower: share of tokens clipped with A > 0 / A < 0.
    """
    low, high = _clip_bounds(config)
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(-1).clamp_min(1)  # (B,)
    log_ratio = log_prob - old_log_prob  # (B, T)
    sign = torch.sign(advantages)
    log_ratio_clamped = log_ratio.clamp(-low, high)
    log_ratio_min = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clamped)
    seq_ratio = torch.exp((log_ratio_min * mask).sum(-1) / lengths)  # (B,)
    seq_adv = (advantages * mask).sum(-1) / lengths  # (B,)
    pg_losses = -seq_adv * seq_ratio  # (B,)
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.clamp_min(1e-10)) * mask
        pg_losses = pg_losses * torch.exp(log_w.sum(-1) / lengths)
    num_seqs = pg_losses.shape[0] if global_seqs is None else global_seqs
    pg_loss = pg_losses.sum() / num_seqs
    with torch.no_grad():
        clipped = (log_ratio != log_ratio_clamped).to(log_prob.dtype)
        clipfrac = masked_mean(clipped * (advantages > 0), response_mask)
        clipfrac_lower = masked_mean(clipped * (advantages < 0), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return _metrics(pg_loss, clipfrac, clipfrac_lower, ppo_kl)
