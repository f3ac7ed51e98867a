"""Trainer FSDP2 shards -> tensor-parallel rollout pieces, without gathering whole tensors.

FSDP2 holds each parameter as row blocks (dim 0) over the ranks of its shard group; the TP
rollout engine of rank r needs `tp_shards.shard(name, full, config, r % tp, tp)` — a block of
rows (column- and vocab-parallel weights), a block of columns (row-parallel weights), or the
whole tensor (norms, biases of row-parallel layers). For each parameter, one `all_to_all_single`
inside the shard group moves exactly that: every owner cuts, from its row block, the part each
destination needs (rows ∩ the destination's row range, or its rows x the destination's
columns), and every rank concatenates what it receives, in row order. No rank builds a whole
tensor; the extra memory is one parameter's piece at a time (the pieces are yielded one by one).

A rank receives about 1/tp of every sharded matrix, where a full gather (`full_tensor()`, the
TP=1 path) receives all of it: `Reshard.bytes_received` and `Reshard.full_gather_bytes` count
both, per rank. LoRA: the adapters are gathered whole (they are small), and the piece of the
merged weight is the piece of the base plus the same piece of scale x B @ A.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

from hybridrl.models import tp_shards


@dataclass
class Reshard:
    """One pass over a model's parameters; the byte counts fill in as the pieces are consumed."""

    model: torch.nn.Module
    config: object  # the HF config (heads, KV heads, head_dim for the slices)
    tp_rank: int
    tp_size: int
    bytes_received: int = 0
    full_gather_bytes: int = 0

    def __post_init__(self):
        # The rollout layout numbers ranks replica x tp + tp_rank, and the pieces other ranks are sent
        # are computed from their global ranks that way: a tp_rank given otherwise would load this
        # rank's engine with another rank's slices (log-probs that drift from the trainer's).
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"reshard: tp_rank {self.tp_rank} is outside 0..{self.tp_size - 1}")
        if dist.is_available() and dist.is_initialized() and self.tp_size > 1:
            expected = dist.get_rank() % self.tp_size
            if self.tp_rank != expected:
                raise ValueError(
                    f"reshard: rank {dist.get_rank()} was given tp_rank {self.tp_rank}, but the rollout layout makes it "
                    f"tp rank {expected} of {self.tp_size} (global rank % tp)"
                )

    def pieces(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, this rank's TP piece) for every parameter of the policy, adapters merged."""
        model = self.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        lora_layers = _lora_layers(base) if base is not model else {}
        for name, p in base.named_parameters():
            if ".lora_" in name:
                continue
            owner, hf_name = None, name
            if ".base_layer." in name:
                owner, rest = name.split(".base_layer.", 1)
                hf_name = f"{owner}.{rest}"
            piece = self._piece(hf_name, p.detach())
            if owner is not None and hf_name.endswith(".weight"):
                delta = _lora_delta(lora_layers[owner])
                if delta is not None:
                    cut = tp_shards.shard(hf_name, delta, self.config, self.tp_rank, self.tp_size)
                    piece = (piece.float() + cut).to(piece.dtype)
            yield hf_name, piece

    def _piece(self, name: str, p: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Shard

        shape = tuple(p.shape)
        self.full_gather_bytes += p.numel() * p.element_size()
        if not isinstance(p, DTensor) or not any(isinstance(pl, Shard) and pl.dim == 0 for pl in p.placements):
            local = p.to_local() if isinstance(p, DTensor) else p
            return tp_shards.shard(name, local, self.config, self.tp_rank, self.tp_size).clone()
        mesh_dim = next(i for i, pl in enumerate(p.placements) if isinstance(pl, Shard) and pl.dim == 0)
        group = p.device_mesh.get_group(mesh_dim)
        members = dist.get_process_group_ranks(group)
        me = dist.get_rank(group)
        local = p.to_local()
        rows = _row_blocks(shape[0], len(members))
        lo, hi = rows[me]
        if local.shape[0] != hi - lo:
            raise RuntimeError(f"reshard: {name}'s local shard has {local.shape[0]} rows, expected {hi - lo} (rows {lo}..{hi})")
        # what each member needs: its TP rank's slice (the rollout layout numbers ranks replica x tp + tp_rank)
        needs = [tp_shards.tp_slice(name, shape, self.config, g % self.tp_size, self.tp_size) for g in members]
        send = [_cut(local, lo, hi, need).reshape(-1) for need in needs]
        recv_sizes = [_cut_numel(shape, rows[src], needs[me]) for src in range(len(members))]
        out = local.new_empty(sum(recv_sizes))
        dist.all_to_all_single(
            out, torch.cat(send), output_split_sizes=recv_sizes, input_split_sizes=[t.numel() for t in send], group=group
        )
        self.bytes_received += out.numel() * out.element_size()
        parts = []
        for src, chunk in enumerate(out.split(recv_sizes)):
            r0, r1 = _clip(rows[src], needs[me])
            width = _width(shape, needs[me])
            parts.append(chunk.view(r1 - r0, *width))
        return torch.cat(parts)


def _row_blocks(n: int, world: int) -> list[tuple[int, int]]:
    """FSDP2's dim-0 blocks (torch.chunk): ceil(n / world) rows each, the last ones short or empty."""
    block = -(-n // world)
    return [(min(i * block, n), min((i + 1) * block, n)) for i in range(world)]


def _clip(rows: tuple[int, int], need: tp_shards.Slice | None) -> tuple[int, int]:
    """The part of a row block a need covers (all of it unless the need is a block of rows)."""
    lo, hi = rows
    if need is not None and need.dim == 0:
        lo, hi = max(lo, need.start), min(hi, need.stop)
    return lo, max(lo, hi)


def _width(shape: tuple[int, ...], need: tp_shards.Slice | None) -> tuple[int, ...]:
    """The trailing dims of a piece: whole, or the needed columns of a row-parallel weight."""
    rest = list(shape[1:])
    if need is not None and need.dim == 1:
        rest[0] = need.stop - need.start
    return tuple(rest)


def _cut(local: torch.Tensor, lo: int, hi: int, need: tp_shards.Slice | None) -> torch.Tensor:
    r0, r1 = _clip((lo, hi), need)
    piece = local[r0 - lo : r1 - lo]
    if need is not None and need.dim == 1:
        piece = piece[:, need.start : need.stop]
    return piece.contiguous()


def _cut_numel(shape: tuple[int, ...], rows: tuple[int, int], need: tp_shards.Slice | None) -> int:
    r0, r1 = _clip(rows, need)
    n = r1 - r0
    for d in _width(shape, need):
        n *= d
    return n


def _lora_layers(base) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}


def _lora_delta(layer) -> torch.Tensor | None:
    from hybridrl.models.lora import adapter_delta

    return adapter_delta(layer)
