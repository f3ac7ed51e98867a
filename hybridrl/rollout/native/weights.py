"""The native engine's weights in: the trainer's tensors aliased (zero copy) or copied in, whole
or as this rank's tensor-parallel shard (`ModelRunner.weights`)."""

from __future__ import annotations

from typing import Iterable

import torch

from hybridrl.models import tp_shards


def canonical_name(name: str) -> str | None:
    """Map a trainer parameter name (plain HF, torch.compile'd, DDP or peft-wrapped) to the HF name.

    Unmerged LoRA factors cannot be applied by a copy: they raise instead of being dropped
    silently (the engine would sample from the base model).
    """
    for prefix in ("_orig_mod.", "module.", "base_model.model."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if ".lora_" in name or "lora_embedding" in name:
        raise ValueError(
            f"weight {name!r} is an unmerged LoRA factor; merge the adapters into the base weights "
            f"before syncing them to the native engine (or use rollout.name=hf)"
        )
    return name.replace(".base_layer.", ".")


class WeightLoader:
    """Puts weights into the runner's model: `alias_weights` shares the trainer's tensors,
    `load_weights` copies (full tensors, or this TP rank's slices)."""

    def __init__(self, model, hf_config, tp):
        self.model, self.hf_config, self.tp = model, hf_config, tp  # tp: a TensorParallel, or None at TP=1

    def alias_weights(self, model) -> None:
        """Make the runner's parameters the trainer's tensors (same storage): in-place optimizer
        steps are then visible to the engine with no sync at all."""
        if self.tp:
            raise ValueError("a tensor-parallel engine holds weight shards: load them with load_weights, not alias_weights")
        own = self.model.state_dict()
        shared = {}
        for name, t in model.state_dict().items():
            name = canonical_name(name)
            if name in own:
                shared[name] = t.detach()
        missing = set(own) - set(shared)
        if missing:
            raise ValueError(f"the trainer model has no weights for {sorted(missing)[:5]}")
        self.model.fuse_projections(False)  # fused copies would not see the trainer's updates
        self.model.load_state_dict(shared, assign=True)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], sharded: bool = False) -> None:
        """Copy weights in one tensor at a time (converting dtype/device on the way); tensors the
        runner already aliases are skipped. Names the model does not have raise. With TP, full
        tensors are sliced to this rank's shard; `sharded=True`: they already are (see the engine)."""
        params = dict(self.model.named_parameters())
        for name, t in named_tensors:
            name = canonical_name(name)
            if name == "lm_head.weight" and self.model.tied:
                continue  # tied: the embedding is the head
            p = params.get(name)
            if p is None and self.model.load_expert(name, t):  # a per-expert checkpoint weight (MoE)
                continue
            if p is None:
                raise KeyError(f"load_weights: the native model has no parameter {name!r}")
            if self.tp:
                self._load_shard(name, p, t, sharded)
            elif p.data_ptr() != t.data_ptr():
                p.copy_(t.detach(), non_blocking=True)

    def _load_shard(self, name: str, p: torch.Tensor, t: torch.Tensor, sharded: bool) -> None:
        if not sharded:
            t = tp_shards.shard(name, t, self.hf_config, self.tp.rank, self.tp.size)
        if name.split(".")[-2] in tp_shards.VOCAB:
            p = p[: t.shape[0]]  # the last vocabulary block is padded; the padding rows stay zero
        if p.shape != t.shape:
            raise ValueError(
                f"load_weights: {name!r} of shape {tuple(t.shape)} is not TP rank {self.tp.rank}/{self.tp.size}'s "
                f"shard {tuple(p.shape)}" + (" (a full tensor passed with sharded=True?)" if sharded else "")
            )
        p.copy_(t.detach(), non_blocking=True)
