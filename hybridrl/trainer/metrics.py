"""Batch statistics under verl's metric names."""

from __future__ import annotations

import torch

from hybridrl.algorithms import improbable_token_frac, masked_mean
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


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
