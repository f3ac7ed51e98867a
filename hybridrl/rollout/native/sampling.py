"""Sampling on the device with per-sequence seeds: a counter-based hash and the Gumbel-max trick.

Each sequence carries a seed. The noise for vocabulary entry `v` at sequence position `p` is a
pure function of (seed, p, v): a 32-bit integer hash -> uniform u -> Gumbel g = -log(-log u), and
the sampled token is argmax(logits / T + g), an exact sample of softmax(logits / T) (the
Gumbel-max trick).

The noise is finite for every hash value, in float32, on every path (`noise_bounds` gives its
range). Two places need care, and both once drew a uniformly random token in ~1% of draws at a
152k vocabulary (issue 39):
- u = ((h >> 8) + 0.5) / 2**24 rounds to exactly 1.0 for the largest hash (16777215.5 is not a
  float32), and -log(-log 1) = +inf wins whatever the logit. u is clamped to the largest float32
  below 1.
- Near u = 1 the exponential E = -log u is tiny and decides which token wins; a fast
  approximate log (the GPU's lg2.approx, absolute error ~2**-22) is useless there. For
  w = 1 - u < 1/16 (exact in float32: u >= 1/2), E comes from the series w + w^2/2 + ... + w^7/7
  (relative error < 1e-9); elsewhere from log(u), whose argument is then at most 15/16.
The Triton sampler computes the same function with the same float32 operations.

Nothing depends on a generator's state, so
- the same seed gives the same tokens whatever else is in the batch and in whatever row, and
- the whole step is a fixed sequence of kernels that a CUDA graph can capture and replay.

The log-prob recorded for each sampled token is log softmax(logits / T) at that token, over the
full vocabulary (before top-k/top-p), the same quantity the HF engine and the trainer compute.
Greedy decoding takes argmax(logits) and records log softmax(logits) (T = 1).

`sample` is the torch implementation (CPU, and GPU with top-k/top-p); on CUDA without top-k/top-p,
`hybridrl.rollout.native.triton_kernels.fused_sample` computes the same in one pass over the logits.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # multiplier of a well-mixing 32-bit integer hash (fits in 31 bits)


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2**32).

    The products stay below 2**59, so int64 never overflows and the result equals the uint32
    arithmetic of the Triton kernel bit for bit.
    """
    x = ((x >> 16) ^ x) * _MUL & MASK32
    x = ((x >> 16) ^ x) * _MUL & MASK32
    return (x >> 16) ^ x


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B,) seeds and (B,) positions of the token being sampled -> (B,) per-row hash keys."""
    return mix32(mix32(seeds & MASK32) ^ (positions & MASK32))


U_MAX = 1.0 - 2.0**-24  # the largest float32 below 1
SERIES_BELOW = 1.0 / 16  # w = 1 - u below this: E from the series, not from log(u)


def exponential_from_hash(h: torch.Tensor) -> torch.Tensor:
    """Hash values (int64 in [0, 2**32)) -> float32 E = -log(u), u uniform in (0, 1) from the top
    24 bits: E in [5.96e-8, 17.33], finite and positive for every hash value."""
    u = (((h >> 8).float() + 0.5) * (1.0 / (1 << 24))).clamp_(max=U_MAX)
    w = 1.0 - u  # exact where it is used (u > 15/16)
    series = w * (1.0 + w * (1 / 2 + w * (1 / 3 + w * (1 / 4 + w * (1 / 5 + w * (1 / 6 + w * (1 / 7)))))))
    return torch.where(w < SERIES_BELOW, series, -torch.log(u))


def gumbel_noise(keys: torch.Tensor, vocab: int, offset: int = 0) -> torch.Tensor:
    """(B,) row keys -> (B, V) float32 Gumbel noise, a function of (key, vocab index) only; `offset`:
    the first column's vocabulary index (a tensor-parallel rank's block)."""
    idx = torch.arange(offset, offset + vocab, device=keys.device, dtype=torch.int64)
    h = mix32(keys[:, None] ^ idx[None, :])  # (B, V)
    return -torch.log(exponential_from_hash(h))


def noise_bounds() -> tuple[float, float]:
    """The smallest and largest Gumbel noise any hash value gives (float32)."""
    h = torch.tensor([0, (1 << 32) - 1], dtype=torch.int64)
    g = -torch.log(exponential_from_hash(h))
    return float(g[0]), float(g[1])


def mask_unsampled(x: torch.Tensor, vocab_limit: int | None, offset: int = 0) -> torch.Tensor:
    """Set to -inf the columns of x (B, V) whose vocabulary id (offset + column) is at or past
    `vocab_limit` (the tokenizer's length: the embedding's padding rows are never drawn)."""
    if vocab_limit is None or offset + x.shape[-1] <= vocab_limit:
        return x
    ids = torch.arange(offset, offset + x.shape[-1], device=x.device)
    return x.masked_fill(ids >= vocab_limit, float("-inf"))


def filter_top_k_top_p(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf the scaled logits (B, V) outside the top-k and the top-p nucleus."""
    if top_k > 0 and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]  # (B, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the first is kept).
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def sample(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    temperature: float,
    top_k: int = -1,
    top_p: float = 1.0,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V), seeds (B,), positions (B,) -> tokens (B,) int64, log-probs (B,) float32.

    temperature == 0 means greedy. Ids at or past `vocab_limit` are never drawn (their mass stays
    in the log-prob's normalizer, as in the trainer's log-softmax).
    """
    greedy = temperature == 0
    x = logits.float() if greedy else logits.float() / temperature  # (B, V)
    lse = torch.logsumexp(x, dim=-1)  # (B,)
    z = mask_unsampled(x, vocab_limit)
    if greedy:
        tokens = z.argmax(-1)
    else:
        z = filter_top_k_top_p(z, top_k, top_p) + gumbel_noise(row_keys(seeds, positions), x.shape[-1])
        tokens = z.argmax(-1)
    log_probs = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
    return tokens, log_probs
