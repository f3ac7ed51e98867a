"""The supervised warm-up (`warmup.*`): a short stage on (prompt, response) rows before RL, run
once on a fresh start, before the reference policy is frozen (the quickstart uses it)."""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import load_warmup_pairs


def run_warmup(cfg, actor, tokenizer) -> dict:
    """A short supervised stage on (prompt, response) rows before RL (the quickstart uses it)."""
    w = cfg.warmup
    pairs = load_warmup_pairs(
        w.files,
        tokenizer,
        prompt_key=cfg.data.prompt_key,
        max_prompt_length=cfg.data.max_prompt_length,
        truncation=cfg.data.truncation,
    )
    rng = np.random.default_rng(cfg.trainer.seed)
    pad = tokenizer.pad_token_id
    for step in range(1, w.steps + 1):
        # Equal shares for the data-parallel ranks: an update must not train on padding rows.
        size = min(w.batch_size, len(pairs) - len(pairs) % actor.world_size)
        idx = rng.choice(len(pairs), size=size, replace=False)
        m = actor.sft_step(_sft_batch([pairs[i] for i in idx], pad), w.lr)
        if step == w.steps or step % max(1, w.steps // 5) == 0:
            print(
                f"warm-up {step}/{w.steps} | warmup/loss {m['warmup/loss']:.3f} | warmup/token_acc {m['warmup/token_acc']:.3f}",
                flush=True,
            )
    return m


def _sft_batch(pairs, pad: int) -> Batch:
    P = max(len(p) for p, _ in pairs)
    R = max(len(r) for _, r in pairs)
    prompts = torch.full((len(pairs), P), pad, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    responses = torch.full((len(pairs), R), pad, dtype=torch.long)
    response_mask = torch.zeros((len(pairs), R), dtype=torch.float32)
    for i, (p, r) in enumerate(pairs):
        prompts[i, P - len(p) :], prompt_mask[i, P - len(p) :] = torch.tensor(p), 1
        responses[i, : len(r)], response_mask[i, : len(r)] = torch.tensor(r), 1
    return Batch({K.PROMPTS: prompts, K.PROMPT_MASK: prompt_mask, K.RESPONSES: responses, K.RESPONSE_MASK: response_mask})
