"""Advantage estimators, registered by name (config key `algorithm.adv_estimator`).

Every estimator is called with the same keywords and returns `(advantages, returns)`, both
(B, T) and zero on padding:

    fn(*, token_level_rewards, response_mask, index=None, values=None, reward_baselines=None,
       gamma=1.0, lam=1.0, norm_adv_by_std_in_grpo=True, epsilon=1e-6)

Estimators take the full signature (and ignore what they do not use) so that a misspelt keyword
raises instead of being silently dropped. `index` holds one hashable group id per row: rows with
the same id are samples of the same prompt, in any order. Advantages are constants for the
policy loss, so every estimator runs under no_grad. An estimator that needs an input the loop
does not always compute declares it, `register_adv_estimator("remax", needs=("reward_baselines",))`,
and the loop produces it (ReMax: the reward of a greedy response) only for such estimators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hybridrl.algorithms.core import masked_whiten

AdvEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]

ADV_ESTIMATORS: dict[str, AdvEstimator] = {}
# Estimator name -> the batch keys it needs beyond rewards, mask, index and values, which the RL
# loop then produces and passes as keywords of the same names (ReMax: "reward_baselines").
ESTIMATOR_NEEDS: dict[str, tuple[str, ...]] = {}


def register_adv_estimator(name: str, needs: tuple[str, ...] = ()) -> Callable[[AdvEstimator], AdvEstimator]:
    """Decorator: make `fn` available as `get_adv_estimator(name)`, declaring the extra inputs it `needs`."""

    def decorator(fn: AdvEstimator) -> AdvEstimator:
        if name in ADV_ESTIMATORS and ADV_ESTIMATORS[name] is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADV_ESTIMATORS[name] = fn
        ESTIMATOR_NEEDS[name] = tuple(needs)
        return fn

    return decorator


def get_adv_estimator(name: str) -> AdvEstimator:
    """Look up a registered estimator; unknown names raise ValueError listing the known ones."""
    try:
        return ADV_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADV_ESTIMATORS)}") from None


def estimator_needs(name: str) -> tuple[str, ...]:
    """The extra batch keys estimator `name` takes as keywords (unknown names raise as in `get_adv_estimator`)."""
    get_adv_estimator(name)
    return ESTIMATOR_NEEDS[name]


def _group_ids(index: Sequence[Any] | None, batch_size: int, device: torch.device) -> torch.Tensor:
    """Map arbitrary hashable group ids to dense ints 0..G-1.  Returns (B,) int64."""
    if index is None:
        raise ValueError("this advantage estimator needs `index` (one group id per row)")
    ids = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(ids) != batch_size:
        raise ValueError(f"index has {len(ids)} entries for a batch of {batch_size} rows")
    dense: dict[Any, int] = {}
    return torch.tensor([dense.setdefault(i, len(dense)) for i in ids], device=device)


def _group_stats(scores: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group size, sum and unbiased std of `scores` (B,) over rows sharing `group` (B,).

    Two-pass (mean first, then squared deviations) like torch.std. Returns three (B,) tensors;
    std is 0 for groups of one (callers special-case them).
    """
    n_groups = int(group.max()) + 1
    zeros = scores.new_zeros(n_groups)
    size = zeros.index_add(0, group, torch.ones_like(scores))  # (G,)
    total = zeros.index_add(0, group, scores)  # (G,)
    mean = total / size
    sq_dev = zeros.index_add(0, group, (scores - mean[group]) ** 2)  # (G,)
    std = (sq_dev / (size - 1).clamp_min(1)).sqrt()
    return size[group], total[group], std[group]


@register_adv_estimator("gae")
@torch.no_grad()
def compute_gae_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015, arXiv 1506.02438).

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        returns = A + V;  advantages = masked_whiten(A)

    Computed backwards; V beyond the last token is 0. Padding tokens do not advance the
    recursion: V_{t+1} and A_{t+1} are those of the next *valid* token.
    """
    if values is None:
        raise ValueError("gae needs `values` from the critic")
    mask = response_mask.to(values.dtype)
    next_value = values.new_zeros(values.shape[0])  # (B,)
    next_adv = values.new_zeros(values.shape[0])  # (B,)
    advantages = torch.zeros_like(values)  # (B, T)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        # On padding keep carrying the values from the next valid token.
        next_value = m * values[:, t] + (1 - m) * next_value
        next_adv = m * adv_t + (1 - m) * next_adv
        advantages[:, t] = next_adv
    returns = (advantages + values) * mask
    advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


@register_adv_estimator("grpo")
@torch.no_grad()
def compute_grpo_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative outcome advantage (GRPO, Shao et al. 2024, arXiv 2402.03300).

        s_i = sum_t m_{i,t} r_{i,t};  A_i = (s_i - mean_g(s)) / (std_g(s) + epsilon)

    std is unbiased. norm_adv_by_std_in_grpo=False drops the division (Dr. GRPO, Liu et al.
    2025, arXiv 2503.20783). A group of one sample uses mean 0, std 1. A_i is broadcast over
    the response tokens; returns = advantages.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    scores = (token_level_rewards * mask).sum(dim=-1)  # (B,)
    group = _group_ids(index, scores.shape[0], scores.device)
    size, total, std = _group_stats(scores, group)
    single = size == 1
    mean = torch.where(single, torch.zeros_like(total), total / size)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (std + epsilon)
    advantages = adv[:, None] * mask  # (B, T)
    return advantages, advantages


@register_adv_estimator("rloo")
@torch.no_grad()
def compute_rloo_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv 2402.14740).

        s_i = sum_t m_{i,t} r_{i,t}
        A_i = s_i - (sum_g(s) - s_i) / (n - 1)   for a group of n > 1 samples

    A group of one has no other sample to form a baseline, so its baseline is 0 and A_i = s_i
    (as verl does). Broadcast over the response tokens; returns = advantages.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    scores = (token_level_rewards * mask).sum(dim=-1)  # (B,)
    group = _group_ids(index, scores.shape[0], scores.device)
    size, total, _ = _group_stats(scores, group)
    baseline = torch.where(size > 1, (total - scores) / (size - 1).clamp_min(1), 0.0)
    advantages = (scores - baseline)[:, None] * mask  # (B, T)
    return advantages, advantages


@register_adv_estimator("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): whitened discounted return-to-go.

        G_t = r_t + gamma * G_{t+1}   (reset to 0 on padding);  A = masked_whiten(G)

    Whitening is over the whole batch, not per group. returns = G (unwhitened).
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)  # (B, T)
    running = token_level_rewards.new_zeros(token_level_rewards.shape[0])  # (B,)
    for t in reversed(range(token_level_rewards.shape[1])):
        running = (token_level_rewards[:, t] + gamma * running) * mask[:, t]
        returns[:, t] = running
    advantages = masked_whiten(returns, mask) * mask
    return advantages, returns


@register_adv_estimator("remax", needs=("reward_baselines",))  # = data.keys.REWARD_BASELINES
@torch.no_grad()
def compute_remax_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv 2310.10505): greedy-decoding reward as the baseline.

        G_t = sum_{t' >= t} r_t'  (undiscounted);  A_t = G_t - b

    `reward_baselines` (B,) holds b, the reward of each prompt's greedy response.
    """
    if reward_baselines is None:
        raise ValueError("remax needs `reward_baselines` (reward of the greedy response)")
    mask = response_mask.to(token_level_rewards.dtype)
    rewards = token_level_rewards * mask
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask  # (B, T)
    advantages = (returns - reward_baselines[:, None]) * mask
    return advantages, returns


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index) -> tuple:
    """(mask (B, T), per-sequence score s (B,), dense group ids (B,)) for the outcome estimators."""
    mask = response_mask.to(token_level_rewards.dtype)
    scores = (token_level_rewards * mask).sum(dim=-1)  # (B,)
    return mask, scores, _group_ids(index, scores.shape[0], scores.device)


@register_adv_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv 2501.03262, "REINFORCE++-baseline").

        A_i = s_i - mean_g(s)   (a group of one: baseline 0),  broadcast over the tokens,
        then whitened over all response tokens of the batch.

    returns = advantages.
    """
    mask, scores, group = _outcome_scores(token_level_rewards, response_mask, index)
    size, total, _ = _group_stats(scores, group)
    baseline = torch.where(size > 1, total / size, torch.zeros_like(total))
    advantages = (scores - baseline)[:, None] * mask  # (B, T)
    advantages = masked_whiten(advantages, mask) * mask
    return advantages, advantages


@register_adv_estimator("opo")
@torch.no_grad()
def compute_opo_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO, on-policy RL with the optimal baseline (Hao et al. 2025, arXiv 2505.23585).

        b_g = sum_g(|y_j| s_j) / sum_g(|y_j|)   (length-weighted group mean; a group of one: 0)
        A_i = s_i - b_g

    |y_j| is the response length in tokens. Broadcast over the tokens; returns = advantages.
    """
    mask, scores, group = _outcome_scores(token_level_rewards, response_mask, index)
    lengths = mask.sum(dim=-1)  # (B,)
    zeros = scores.new_zeros(int(group.max()) + 1)
    size = zeros.index_add(0, group, torch.ones_like(scores))[group]  # (B,)
    weighted = zeros.index_add(0, group, lengths * scores)[group]
    total_len = zeros.index_add(0, group, lengths)[group]
    baseline = torch.where(size > 1, weighted / total_len.clamp_min(1), torch.zeros_like(scores))
    advantages = (scores - baseline)[:, None] * mask  # (B, T)
    return advantages, advantages


@register_adv_estimator("gpg")
@torch.no_grad()
def compute_gpg_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG, group policy gradient (Chu et al. 2025, arXiv 2504.02546).

        alpha = B / #{i : s_i != 0}   (at least one in the denominator)
        A_i   = alpha * (s_i - mean_g(s))   (a group of one: mean 0)

    No division by the group's std. alpha scales the gradient up when few samples earn a
    reward, so that groups with no signal do not dilute the batch. Pair it with
    actor.policy_loss.loss_mode=gpg. Broadcast over the tokens; returns = advantages.
    """
    mask, scores, group = _outcome_scores(token_level_rewards, response_mask, index)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp_min(1)
    size, total, _ = _group_stats(scores, group)
    mean = torch.where(size > 1, total / size, torch.zeros_like(total))
    advantages = (alpha * (scores - mean))[:, None] * mask  # (B, T)
    return advantages, advantages


@register_adv_estimator("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_advantages(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    values: torch.Tensor | None = None,
    reward_baselines: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k training (Chen et al. 2025, arXiv 2503.19595): only each group's best sample learns.

        A_best = (s_max - s_second) / (std_g(s) + epsilon)   (no division without norm_adv_by_std_in_grpo)
        A_i    = 0 for every other sample

    The best is the first sample with the group's top score; std is unbiased. Every group needs
    at least two samples (rollout.n >= 2). Broadcast over the tokens; returns = advantages.
    """
    mask, scores, group = _outcome_scores(token_level_rewards, response_mask, index)
    adv = torch.zeros_like(scores)  # (B,)
    for g in range(int(group.max()) + 1):
        rows = (group == g).nonzero().squeeze(-1)  # (k,) in batch order
        if len(rows) < 2:
            raise ValueError(f"grpo_passk needs at least 2 samples per prompt; a group has {len(rows)} (set rollout.n >= 2)")
        s = scores[rows]
        top2 = torch.topk(s, 2).values
        best = rows[torch.argmax(s)]  # the first of the maxima
        gap = top2[0] - top2[1]
        adv[best] = gap / (s.std() + epsilon) if norm_adv_by_std_in_grpo else gap
    advantages = adv[:, None] * mask  # (B, T)
    return advantages, advantages
