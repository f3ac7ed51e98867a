"""The paged KV cache: fixed-size blocks of token slots, handed out by a reference-counted allocator.

Layout: one tensor (layers, 2, num_blocks, block_size, n_kv_heads, head_dim); `k(layer)` and
`v(layer)` are the (num_blocks, block_size, n_kv_heads, head_dim) views the attention reads.
A sequence owns a list of block ids (its block table); token t of the sequence lives in block
`table[t // block_size]`, slot `t % block_size`. Block 0 is never handed out: padded rows of a
CUDA-graph batch write their (ignored) K/V there.

The `n` samples of a prompt share the prompt's full blocks (refcount n); each sample gets its own
copy of the partially filled last block, into which it then writes its own tokens.
"""

from __future__ import annotations

import math
import os

import torch


class CacheFullError(RuntimeError):
    pass


class BlockAllocator:
    """Free list + reference counts over block ids 1..num_blocks-1 (0 is the scratch block)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free_ids = list(range(num_blocks - 1, 0, -1))  # pop() hands out low ids first
        self.refcount = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def usable(self) -> int:
        return self.num_blocks - 1

    def allocate(self) -> int:
        if not self.free_ids:
            raise CacheFullError("no free KV cache block")
        b = self.free_ids.pop()
        self.refcount[b] = 1
        return b

    def share(self, block: int) -> None:
        assert self.refcount[block] > 0, f"block {block} is not allocated"
        self.refcount[block] += 1

    def release(self, block: int) -> None:
        self.refcount[block] -= 1
        assert self.refcount[block] >= 0, f"block {block} released twice"
        if self.refcount[block] == 0:
            self.free_ids.append(block)


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.block_size = block_size
        # (layers, K/V, blocks, block_size, Hkv, D)
        self.data = torch.zeros(num_layers, 2, num_blocks, block_size, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.allocator = BlockAllocator(num_blocks)

    def k(self, layer: int) -> torch.Tensor:
        return self.data[layer, 0]

    def v(self, layer: int) -> torch.Tensor:
        return self.data[layer, 1]

    def copy_blocks(self, src: list[int], dst: list[int]) -> None:
        """Copy whole blocks (all layers, K and V): the partial last prompt block per sample."""
        if src:
            s = torch.tensor(src, device=self.data.device)
            d = torch.tensor(dst, device=self.data.device)
            self.data[:, :, d] = self.data[:, :, s]

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use now."""
        a = self.allocator
        return 1.0 - a.num_free / a.usable

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, n_kv_heads: int, head_dim: int, dtype) -> int:
        return num_layers * 2 * block_size * n_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def write_kv(cache_k: torch.Tensor, cache_v: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store new tokens' K/V at flat slot ids: k, v (N, Hkv, D), slots (N,) = block * block_size + offset."""
    nb, bs = cache_k.shape[:2]
    cache_k.view(nb * bs, *cache_k.shape[2:]).index_copy_(0, slots, k)
    cache_v.view(nb * bs, *cache_v.shape[2:]).index_copy_(0, slots, v)


ALLOC_CONF_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def stable_cache_addresses() -> bool:
    """Use PyTorch's expandable segments unless the allocator is configured already (either
    variable set, even empty, wins). The engine frees its KV cache for the update and allocates
    it again at wake-up; its CUDA graphs baked in the old address and are re-captured when the
    new cache lands elsewhere. With the default allocator it landed elsewhere nearly every step
    (2 graphs re-captured per step, 0.1-0.7 s, on an H100); with expandable segments the address
    repeats after the first steps and nothing is re-captured (BENCHMARKS.md). Must run before the
    process's first CUDA allocation; returns whether it set the variable."""
    if any(k in os.environ for k in ALLOC_CONF_KEYS):
        return False
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return True
