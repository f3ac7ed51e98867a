"""Ulysses sequence-parallel collectives on a given process group (autograd-aware).

The ops `models/packing.py` runs inside a packed pass when its caller passes a sequence-parallel
group (`hybridrl.distributed.ulysses.sp_group()` builds that group from the run's layout; see
that module for the scheme and why the gradients come out right).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_size(group) -> int:
    return dist.get_world_size(group)


def group_rank(group) -> int:
    return dist.get_rank(group)


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    """Chunk k of dim 0 goes to rank k; chunk k of the result came from rank k."""
    x = x.contiguous()
    out = torch.empty_like(x)  # (after contiguous: empty_like keeps a strided input's strides)
    dist.all_to_all_single(out, x, group=group)
    return out


def _seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    sp = dist.get_world_size(group)
    n, h, d = x.shape
    parts = x.view(n, sp, h // sp, d).transpose(0, 1)  # (sp, n, h/sp, d): head group k for rank k
    return _all_to_all(parts, group).reshape(sp * n, h // sp, d)  # rank k's tokens are rows k*n..


def _heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    sp = dist.get_world_size(group)
    total, h, d = x.shape
    n = total // sp
    got = _all_to_all(x.view(sp, n, h, d), group)  # (sp, n, h, d): head group k from rank k
    return got.transpose(0, 1).reshape(n, sp * h, d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, ctx.group), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, ctx.group), None


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """(N/sp tokens, H, D) on each rank -> (N tokens, H/sp heads, D): rank k keeps heads k*H/sp..."""
    return _SeqToHeads.apply(x, group)


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """The inverse of `seq_to_heads`: (N, H/sp, D) -> (N/sp, H, D)."""
    return _HeadsToSeq.apply(x, group)


class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.n = group, x.shape[1]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce_scatter
        rank = dist.get_rank(ctx.group)
        return grad[:, rank * ctx.n : (rank + 1) * ctx.n], None


def gather_tokens(x: torch.Tensor, group) -> torch.Tensor:
    """(1, N/sp, ...) on each rank -> (1, N, ...), the ranks' slices in order; the backward sums
    the ranks' gradients of the whole row and keeps this rank's slice."""
    return _GatherTokens.apply(x, group)


def expand_kv_heads(k: torch.Tensor, v: torch.Tensor, q_heads: int, sp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, Hkv, D) key/value heads that do not split over sp ranks -> one per query head."""
    kv = k.shape[1]
    if kv % sp == 0:
        return k, v
    rep = q_heads // kv
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def split_row(n: int, sp: int, rank: int) -> tuple[int, int]:
    """(padded length, first token of this rank's slice) of a row of n tokens over sp ranks."""
    padded = -(-n // sp) * sp
    return padded, rank * (padded // sp)
