"""Preference and supervised losses as pure tensor functions: DPO (+ IPO, hinge, cDPO), KTO, SFT,
and the Bradley-Terry loss of reward-model training.

Inputs are per-sequence log-probs: the sum over a completion's tokens of log pi(token), shape
(B,). The functions return *per-example* losses; the caller divides their sum by the example
count of the whole optimizer step, so gradient accumulation over micro-batches is exact
(the same rule as `agg_loss`'s `global_tokens`). Rewards are the implicit rewards
beta * (log pi - log pi_ref), detached, under the names TRL users know.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridrl.algorithms.losses import Count, agg_loss
from hybridrl.config.names import DPO_LOSS_TYPES


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Pairwise preference losses on the log-ratio margin h (all tensors (B,)):

        h       = (logp_c - logp_r) - (ref_c - ref_r)
        sigmoid = -(1 - ls) log sigmoid(beta h) - ls log sigmoid(-beta h)   DPO, Rafailov et al. 2023
                                                     (ls > 0: conservative DPO, Mitchell 2023, "cDPO")
        ipo     = (h - 1 / (2 beta))^2                                      IPO, Azar et al. 2023 (arXiv 2310.12036)
        hinge   = relu(1 - beta h)                                          SLiC, Zhao et al. 2023

    IPO here uses summed log-probs as in the paper; TRL averages them per token for IPO.
    Returns `losses` (B,), and the detached `chosen_rewards` / `rejected_rewards` (B,).
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; known: {DPO_LOSS_TYPES}")
    margin = (policy_chosen_logps - policy_rejected_logps) - (ref_chosen_logps - ref_rejected_logps)  # (B,)
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * margin) - label_smoothing * F.logsigmoid(-beta * margin)
    elif loss_type == "ipo":
        losses = (margin - 1 / (2 * beta)) ** 2
    else:
        losses = torch.relu(1 - beta * margin)
    return {
        "losses": losses,
        "chosen_rewards": beta * (policy_chosen_logps - ref_chosen_logps).detach(),
        "rejected_rewards": beta * (policy_rejected_logps - ref_rejected_logps).detach(),
    }


def bradley_terry_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, margin: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """Reward-model loss on scalar scores r (B,) of the two completions of each pair:

        loss = -log sigmoid(r_chosen - r_rejected - m)

    Bradley and Terry 1952, as trained for RLHF by Ouyang et al. 2022 (arXiv 2203.02155, eq. 1);
    the per-pair margin m (default 0) asks for a larger gap where annotators' preference is
    stronger (Touvron et al. 2023, Llama 2, arXiv 2307.09288, section 3.2.2).
    Returns `losses` (B,) and the detached `chosen` / `rejected` scores (B,).

    >>> bradley_terry_loss(torch.tensor([1.0]), torch.tensor([1.0]))["losses"]  # log 2: no preference yet
    tensor([0.6931])
    """
    diff = chosen_scores - rejected_scores  # (B,)
    if margin is not None:
        diff = diff - margin
    return {"losses": -F.logsigmoid(diff), "chosen": chosen_scores.detach(), "rejected": rejected_scores.detach()}


def kto_kl_estimate(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z0: the batch mean of log pi - log pi_ref on *mismatched* pairs
    (each prompt with another row's completion), clamped at 0 and detached, as an estimate
    of KL(pi || pi_ref) that carries no gradient (Ethayarajh et al. 2024, arXiv 2402.01306, §4.1)."""
    return (policy_kl_logps - ref_kl_logps).mean().clamp(min=0).detach()


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    labels: torch.Tensor,
    kl_ref_point: torch.Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> dict[str, torch.Tensor]:
    """KTO (Ethayarajh et al. 2024, arXiv 2402.01306) on unpaired examples; tensors (B,).

        r            = logp - ref
        desirable    = lambda_D (1 - sigmoid(beta (r - z0)))      where labels is true
        undesirable  = lambda_U (1 - sigmoid(beta (z0 - r)))      where labels is false

    `kl_ref_point` is z0 (see `kto_kl_estimate`); it is clamped at 0 and carries no gradient.
    Returns `losses` (B,) and the detached `rewards` = beta r (B,).
    """
    z0 = torch.as_tensor(kl_ref_point, dtype=policy_logps.dtype, device=policy_logps.device).clamp(min=0).detach()
    r = policy_logps - ref_logps  # (B,)
    desirable = desirable_weight * (1 - torch.sigmoid(beta * (r - z0)))
    undesirable = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r)))
    return {"losses": torch.where(labels.bool(), desirable, undesirable), "rewards": beta * r.detach()}


def sft_loss(log_probs: torch.Tensor, response_mask: torch.Tensor, *, global_tokens: Count | None = None) -> torch.Tensor:
    """Mean negative log-likelihood of the response tokens only (prompt tokens carry no loss).

    log_probs, response_mask: (B, R). With `global_tokens` (the step's response-token count)
    the micro-batch losses of one step add up to the step's token mean.
    """
    return -agg_loss(log_probs, response_mask, "token-mean", global_tokens=global_tokens)
