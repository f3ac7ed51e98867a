"""Replicated data parallel (`fsdp_config.fsdp_size=1` on several ranks): every rank holds the whole
model, as one device does, and the gradients are averaged across ranks once per optimizer step.

For models whose training state fits one GPU (about 16 bytes a parameter: fp32 weights, gradients
and Adam's two moments), FSDP2's per-block gathers and hooks cost more than the compute they wrap
(docs/distributed.md has the measurement). A replicated rank runs the single-device code: the same
compiled layers, the rollout engine aliasing the policy, no gather for the weight sync.

`fsdp.place` marks the model (`mark`); `TrainEngine.step` calls `average_gradients` before clipping.
The loss is normalized for averaged gradients (`fsdp.dp_normalizer`: global count / world), so the
SUM over ranks is divided by the world size, as FSDP's reduce-scatter averages.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 256 * 2**20  # gradients flattened into buckets of this size, one all-reduce each
_MARK = "_hybridrl_replicated"


def _root(model: nn.Module) -> nn.Module:
    """The HF model under a peft (LoRA) wrapper, else the model (the module `fsdp.is_sharded` asks)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def mark(model: nn.Module) -> None:
    """Record that `model` is replicated over the process group (set by `fsdp.place`)."""
    setattr(_root(model), _MARK, True)


def is_replicated(model: nn.Module) -> bool:
    """Whether `model` is a full replica whose gradients must be averaged across ranks."""
    return bool(getattr(_root(model), _MARK, False))


def average_gradients(model: nn.Module, bucket_bytes: int = BUCKET_BYTES) -> None:
    """Average the gradients of `model`'s trainable parameters over all ranks (a collective: every
    rank calls it once per optimizer step, after the last micro-batch's backward). No-op unless
    `model` is replicated on several ranks.

    A parameter that got no gradient on some ranks (a branch not taken) counts as a zero gradient
    there; one that got none on any rank keeps `grad=None`, as on one device (AdamW skips it). The
    ranks agree on which is which with one small all-reduce first, so their buckets match."""
    if not is_replicated(model) or not dist.is_initialized() or dist.get_world_size() == 1:
        return
    world = dist.get_world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    device = params[0].device
    has = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
    dist.all_reduce(has)
    grads = []
    for p, n in zip(params, has.tolist(), strict=True):
        if n == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    for bucket in _buckets(grads, bucket_bytes):
        flat = _flatten_dense_tensors(bucket)
        dist.all_reduce(flat)
        flat.div_(world)
        for g, avg in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            g.copy_(avg)


def _buckets(grads: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive gradients of one device and dtype, up to `bucket_bytes` each (a larger gradient
    alone). The order is the parameters' order, the same on every rank."""
    out: list[list[torch.Tensor]] = []
    size, key = 0, None
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not out or (g.device, g.dtype) != key or size + nbytes > bucket_bytes:
            out.append([])
            size, key = 0, (g.device, g.dtype)
        out[-1].append(g)
        size += nbytes
    return out
