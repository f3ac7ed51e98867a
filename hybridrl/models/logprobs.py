"""Token log-probs and entropy from logits, and the forward pass over prompt + response.

Chunked over rows so that a float32 copy of `[tokens, vocab]` never exists all at once
(the fast-updates work replaces this with a fused kernel; the contract stays the same).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """log softmax(logits)[labels]; logits (B, R, V), labels (B, R) -> (B, R) float32."""
    out = []
    for lg, lb in zip(logits.split(chunk), labels.split(chunk)):
        lg = lg.float()
        out.append(lg.gather(-1, lb.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(lg, dim=-1))
    return torch.cat(out)


def entropy_from_logits(logits: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) * z; logits (B, R, V) -> (B, R) float32."""
    out = []
    for lg in logits.split(chunk):
        lg = lg.float()
        p = F.softmax(lg, dim=-1)
        out.append(torch.logsumexp(lg, dim=-1) - (p * lg).sum(-1))
    return torch.cat(out)


def sequence_inputs(prompts, prompt_mask, responses, response_mask):
    """Concatenate left-padded prompts and right-padded responses.

    Returns input_ids (B, T), attention_mask (B, T) and position_ids (B, T) counting from the
    first real prompt token, so that padding never shifts positions.
    """
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def response_logits(model, prompts, prompt_mask, responses, response_mask, temperature: float = 1.0):
    """Logits that predict each response token: (B, R, V), divided by `temperature`.

    The logit at position t predicts token t+1, so the response's logits start one before it.
    """
    input_ids, attention_mask, position_ids = sequence_inputs(prompts, prompt_mask, responses, response_mask)
    R = responses.shape[1]
    # Only the last R + 1 positions feed the LM head: the prompt's logits (P x V) are never built.
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, logits_to_keep=R + 1
    ).logits
    logits = logits[:, -(R + 1) : -1]  # (B, R, V)
    if temperature not in (0, 1.0):
        logits = logits / temperature
    return logits
