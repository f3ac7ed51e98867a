"""Attention over the paged KV cache.

- Prefill: the new sequences' tokens are right-padded into (B, T); K/V are written to the cache
  through a slot mapping and the queries attend causally over the new tokens (no prefix reuse), so
  plain causal SDPA is exact and padding at the end never reaches a real token.
- Extend: new tokens appended to sequences that already have K/V cached (an agent's tool result
  after the model's turn): they are written after the cached tokens and attend over the cached
  context plus themselves, so the prefix is never recomputed.
- Decode: one query token per sequence attends over its cached context. `paged_decode_reference`
  gathers each sequence's blocks and runs SDPA with a length mask (CPU, and the test oracle);
  on CUDA the Triton kernel in `triton_kernels.py` walks the block table instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hybridrl.models.llama import rotary
from hybridrl.rollout.native.cache import KVCache, write_kv

# Prefill shapes (rows x longest prompt) change with every admitted batch. cuDNN's attention builds
# a plan for each new shape on the host (80-106 ms of a GRPO step's generate on an H200, issue 49),
# so the prefill asks for flash attention first; SDPA falls through the list if flash cannot run.
PREFILL_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def paged_decode_reference(
    q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor
) -> torch.Tensor:
    """q (B, H, D); cache (N, bs, Hkv, D); block_tables (B, M); context_lens (B,) -> (B, H, D)."""
    bs = cache_k.shape[1]
    nb = -(-int(context_lens.max()) // bs)
    tables = block_tables[:, :nb].long()  # (B, nb)
    B = q.shape[0]
    k = cache_k[tables].reshape(B, nb * bs, *cache_k.shape[2:])  # (B, nb*bs, Hkv, D)
    v = cache_v[tables].reshape(B, nb * bs, *cache_v.shape[2:])
    valid = torch.arange(nb * bs, device=q.device)[None, :] < context_lens[:, None]  # (B, nb*bs)
    out = F.scaled_dot_product_attention(
        q[:, :, None, :],
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=valid[:, None, None, :],
        enable_gqa=q.shape[1] != k.shape[2],
    )
    return out[:, :, 0, :]


class PrefillAttention:
    """attend() for a right-padded prefill batch: writes K/V at `slots` (valid tokens only).

    With `kernels` (the Triton module, CUDA) one kernel rotates q and k and stores the rotated k
    and v of every token (padding tokens go to the scratch block 0), in place of the torch
    rotary (float32 copies, cat, neg) and the index copies; the attention is SDPA either way."""

    def __init__(self, cache: KVCache, slots: torch.Tensor, valid: torch.Tensor, kernels=None, rope_tables=None):
        self.cache, self.slots, self.valid = cache, slots, valid  # slots (N,), valid (B*T,) flat indices
        self.kernels, self.rope_tables = kernels, rope_tables
        self.owns_rope = kernels is not None  # the model need not gather cos/sin for it
        self._flat = None  # (positions, slots) over all B*T tokens, built on the first layer

    def __call__(self, layer: int, q, k, v, cos, sin):
        B, T = q.shape[:2]
        if self.kernels is not None:
            q, k = self._rope_store_fused(layer, q, k, v)
        else:
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            flat = lambda x: x.reshape(B * T, *x.shape[2:])[self.valid]  # noqa: E731  (N, Hkv, D)
            write_kv(self.cache.k(layer), self.cache.v(layer), flat(k), flat(v), self.slots)
        with sdpa_kernel(PREFILL_BACKENDS):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=q.shape[2] != k.shape[2]
            )  # (B, H, T, D)
        return out.transpose(1, 2)

    def _rope_store_fused(self, layer: int, q, k, v):
        B, T, H, D = q.shape
        n_kv, N = k.shape[2], B * T
        if self._flat is None:
            positions = torch.arange(T, device=q.device).repeat(B)  # right padding: token t sits at position t
            slots = torch.zeros(N, dtype=self.slots.dtype, device=q.device)  # padding -> scratch block 0
            self._flat = (positions, slots.index_copy_(0, self.valid, self.slots))
        qk = _joint_heads(q, k).reshape(N, H + n_kv, D)  # q and k rotated by one kernel call
        out = self.kernels.rope_and_store(
            qk,
            k.reshape(N, n_kv, D),
            v.reshape(N, n_kv, D),
            *self.rope_tables,
            *self._flat,
            self.cache.k(layer),
            self.cache.v(layer),
        )
        out = out.view(B, T, H + n_kv, D)
        return out[:, :, :H], out[:, :, H:]


def _joint_heads(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, T, H, D) and (B, T, Hkv, D) -> (B, T, H + Hkv, D): a view when k's heads follow q's in
    one buffer (the fused qkv projection's output), else a copy."""
    B, T, H, D = q.shape
    s = q.stride()
    if (
        k.stride() == s
        and s[3] == 1
        and s[2] == D
        and s[0] == T * s[1]
        and k.data_ptr() == q.data_ptr() + H * D * q.element_size()
    ):
        return q.as_strided((B, T, H + k.shape[2], D), s)
    return torch.cat([q, k], dim=2)


class ExtendAttention:
    """attend() for new tokens right-padded into (B, T) that continue cached sequences: row i's
    tokens sit at positions starts[i] .. starts[i] + lens[i] - 1. Their K/V are written at `slots`
    (valid tokens only); the queries attend over the row's whole context, gathered from its
    blocks (`tables`), with the causal limit key position <= query position. The torch rotary
    path runs (the model passes cos/sin of the true positions); the gather is the same as the
    decode reference's, so the cost is one read of each context, once per agent turn."""

    owns_rope = False

    def __init__(
        self,
        cache: KVCache,
        slots: torch.Tensor,
        valid: torch.Tensor,
        tables: torch.Tensor,
        positions: torch.Tensor,
        context: int | None = None,
    ):
        """`context`: the longest row's context after the new tokens (max position + 1), given by
        the host to spare a device sync."""
        self.cache, self.slots, self.valid = cache, slots, valid  # slots (N,), valid (B*T,) flat indices
        self.tables, self.positions = tables, positions  # (B, M) int32 block tables, (B, T) positions
        bs = cache.block_size
        context = int(positions.max()) + 1 if context is None else context
        self.nb = -(-context // bs)
        keys = torch.arange(self.nb * bs, device=positions.device)
        self.mask = keys[None, None, :] <= positions[:, :, None]  # (B, T, C): causal over the whole context

    def __call__(self, layer: int, q, k, v, cos, sin):
        B, T = q.shape[:2]
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        ck, cv = self.cache.k(layer), self.cache.v(layer)
        flat = lambda x: x.reshape(B * T, *x.shape[2:])[self.valid]  # noqa: E731  (N, Hkv, D)
        write_kv(ck, cv, flat(k), flat(v), self.slots)
        tables = self.tables[:, : self.nb].long()
        keys = ck[tables].reshape(B, -1, *ck.shape[2:])  # (B, C, Hkv, D)
        values = cv[tables].reshape(B, -1, *cv.shape[2:])
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=self.mask[:, None],
            enable_gqa=q.shape[2] != k.shape[2],
        )  # (B, H, T, D)
        return out.transpose(1, 2)


class DecodeAttention:
    """attend() for one new token per row: write its K/V at `slots`, attend over `context_lens`.

    With `kernels` (the Triton module, CUDA) the rotary embedding and the K/V store are one kernel
    and the attention another; otherwise the torch code and the gather reference run.
    """

    def __init__(self, cache: KVCache | None, kernels=None):
        self.cache, self.kernels = cache, kernels
        self.owns_rope = kernels is not None  # rotates from its own tables: the model skips the cos/sin gather
        self.slots = self.block_tables = self.context_lens = self.positions = None  # set per step (tensors)
        self.rope_tables = None  # (cos, sin) (P, D) float32, for the fused kernel

    def __call__(self, layer: int, q, k, v, cos, sin):
        B = q.shape[0]  # q (B, 1, H, D), k/v (B, 1, Hkv, D), cos/sin (B, 1, 1, D)
        ck, cv = self.cache.k(layer), self.cache.v(layer)
        if self.kernels is not None and self.kernels.fused_decode_supported(q.shape[-1]):
            out = self.kernels.rope_paged_decode(
                q[:, 0],
                k[:, 0],
                v[:, 0],
                *self.rope_tables,
                self.positions,
                self.slots,
                ck,
                cv,
                self.block_tables,
                self.context_lens,
            )
        elif self.kernels is not None:
            q1 = self.kernels.rope_and_store(q[:, 0], k[:, 0], v[:, 0], *self.rope_tables, self.positions, self.slots, ck, cv)
            out = self.kernels.paged_decode(q1, ck, cv, self.block_tables, self.context_lens)  # (B, H, D)
        else:
            q, k = rotary(q, cos, sin), rotary(k, cos, sin)
            write_kv(ck, cv, k[:, 0], v[:, 0], self.slots)
            out = paged_decode_reference(q[:, 0], ck, cv, self.block_tables, self.context_lens)
        return out.view(B, 1, *out.shape[1:])
