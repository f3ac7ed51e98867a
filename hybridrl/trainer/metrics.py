"""Batch statistics under verl's metric names."""

from __future__ import annotations

import math

import torch

from hybridrl.algorithms import improbable_token_frac, masked_mean
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def group_metrics(uids, scores: torch.Tensor, prefix: str = "critic/groups") -> dict[str, float]:
    """How much of a step can teach a group-relative estimator (GRPO, RLOO, ...): the share of prompts
    whose samples all got the same score, so every advantage in the group is zero
    (`critic/groups/no_signal_frac`), and the share whose samples all got the step's top score
    (`critic/groups/all_top_frac`: on GSM8K, prompts every sample answers right). Empty when no prompt has
    more than one sample (PPO with rollout.n=1). A plateau in which these shares grow means the batch
    holds fewer and fewer prompts to learn from (docs/learning.md); DAPO's dynamic sampling drops them,
    so with it the trained batch logs 0 and every generated group is counted under `train/generated/`
    (trainer/dynamic_sampling.py).

    >>> group_metrics(["a", "a", "b", "b", "c", "c"], torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]))
    {'critic/groups/no_signal_frac': 0.6666666666666666, 'critic/groups/all_top_frac': 0.3333333333333333}
    """
    index: dict = {}
    ids = torch.tensor([index.setdefault(u, len(index)) for u in uids], dtype=torch.long, device=scores.device)
    multi = torch.bincount(ids, minlength=len(index)) > 1
    n = int(multi.sum())
    if n == 0:
        return {}
    s = scores.double()
    hi = torch.full((len(index),), -math.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, ids, s, "amax")
    lo = torch.full((len(index),), math.inf, dtype=s.dtype, device=s.device).scatter_reduce(0, ids, s, "amin")
    uniform = multi & (hi - lo <= 1e-6)
    at_top = uniform & ((lo - s.max()).abs() <= 1e-6)
    return {f"{prefix}/no_signal_frac": int(uniform.sum()) / n, f"{prefix}/all_top_frac": int(at_top.sum()) / n}


def compute_data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    mask = batch[K.RESPONSE_MASK]
    valid = mask.bool()
    response_len = mask.sum(-1)  # (B,)
    prompt_len = batch[K.PROMPT_MASK].sum(-1)  # (B,)
    seq_scores = batch[K.TOKEN_LEVEL_SCORES].sum(-1)
    seq_rewards = batch[K.TOKEN_LEVEL_REWARDS].sum(-1)
    m = {}
    m.update(_stats("critic/score", seq_scores))
    sources = list(batch[K.DATA_SOURCE]) if K.DATA_SOURCE in batch else []
    if len(set(sources)) > 1:  # a mixture: each source's mean score, to see which one the reward comes from
        for src in sorted(set(sources)):
            m[f"critic/score/{src}/mean"] = float(seq_scores[torch.tensor([s == src for s in sources])].mean())
    if K.UID in batch:
        m.update(group_metrics(batch[K.UID], seq_scores))
    m.update(_stats("critic/rewards", seq_rewards))
    m.update(_stats("critic/advantages", batch[K.ADVANTAGES][valid]))
    m.update(_stats("critic/returns", batch[K.RETURNS][valid]))
    if K.VALUES in batch:
        m.update(_stats("critic/values", batch[K.VALUES][valid]))
    m.update(_stats("response_length", response_len))
    m["response_length/clip_ratio"] = float((response_len >= max_response_length).float().mean())
    m.update(_stats("prompt_length", prompt_len))
    m["perf/total_num_tokens"] = float(response_len.sum() + prompt_len.sum())
    # Trainer vs engine probabilities of the same sampled tokens: a mismatch means the engine
    # samples from other weights (a missed weight sync) or numerics that drift from training.
    # (Without OLD_LOG_PROBS, actor.reuse_on_policy_log_prob, the update reports the mean itself.)
    if K.OLD_LOG_PROBS in batch:
        diff = (batch[K.ROLLOUT_LOG_PROBS].exp() - batch[K.OLD_LOG_PROBS].exp()).abs()  # (B, R)
        m["training/rollout_probs_diff_mean"] = float(masked_mean(diff, mask))
        m["training/rollout_probs_diff_max"] = float(diff[valid].max()) if valid.any() else 0.0
        m["rollout/improbable_token_frac"] = float(improbable_token_frac(batch[K.OLD_LOG_PROBS], mask))
    return m
