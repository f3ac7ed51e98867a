"""FSDP2 for the trainable roles, applied from outside the model, and the few collectives the
workers need so that a data-parallel run computes what one device would. `place` leaves the
model whole on every rank when the layout shards nothing (fsdp_size=1: `replicate.py`).

Nothing here runs collectives unless `torch.distributed` is initialized with more than one
rank: on one device (the in-process backend) every function is the single-device identity.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.distributed import replicate
from hybridrl.distributed.layout import active, fsdp_mesh, global_rank, world_size


def dp_size() -> int:
    """The data-parallel size: how many batch shards a step is split into (world / sp)."""
    return active().dp


def dp_rank() -> int:
    """This rank's data-parallel index (its batch shard; shared by the ranks of an sp group)."""
    return active().dp_rank(global_rank())


def dp_normalizer(local_count: float) -> float:
    """The loss normalizer of one rank: the mini-batch's global count (tokens or sequences) / world.

    FSDP averages gradients over all ranks of its mesh (both dimensions under HSDP). A rank
    that divides its loss sum by global/world contributes world * sum_r / global; the average
    over ranks is then sum / global, the single-device gradient, however unevenly the tokens
    fall on the ranks. The local counts are summed over every rank (sp ranks hold disjoint
    pieces of their group's sequences), so the world, not dp, is the divisor.
    """
    world = world_size()
    if world == 1:
        return local_count
    t = torch.tensor([float(local_count)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t) / world


def dp_max_min(local: int) -> tuple[int, int]:
    """(largest, smallest) of an integer over the data-parallel ranks (one all-reduce)."""
    if world_size() == 1:
        return local, local
    t = torch.tensor([local, -local], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t[0]), -int(t[1])


def fsdp_root(model: nn.Module) -> nn.Module:
    """The module FSDP's root unit wraps: the model itself, or the HF model under a peft (LoRA)
    wrapper — its forward and `generate` go through that model's forward, so it must be the root."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(fsdp_root(model), FSDPModule)


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of an HF model (the unit FSDP gathers at a time)."""
    names = {n for m in model.modules() for n in (getattr(m, "_no_split_modules", None) or [])}
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(
            f"cannot find the transformer blocks of {type(model).__name__} to shard "
            "(its _no_split_modules names none of its modules)"
        )
    return blocks


def place(
    model: nn.Module,
    device: torch.device,
    param_offload: bool = False,
    forward_methods: tuple[str, ...] = (),
    mesh=None,
    expert_parallel: int = 1,
) -> nn.Module:
    """The model on its device: moved there on one rank, FSDP2-sharded over several, or replicated
    on every rank when the active layout shards nothing (fsdp_size=1: `distributed/replicate.py`).

    `forward_methods`: methods other than `forward` that callers run the model through (the
    critic's `response_values`); FSDP gathers the root's weights around them too.
    `mesh`: the DeviceMesh to shard over; default the active layout's (`layout.fsdp_mesh`:
    1-D over all ranks, or 2-D replicate x shard = HSDP when fsdp_size is below the world).
    `expert_parallel` > 1: a mixture of experts' experts split over groups of that many ranks
    (`expert_parallel.apply_expert_parallel`), FSDP2 sharding the rest.
    """
    if world_size() == 1:
        return model.to(device)
    if mesh is None and active().replicated:
        if param_offload:
            raise ValueError("fsdp_config.param_offload=true needs FSDP's sharded parameters; fsdp_size=1 replicates the model")
        broadcast_from_rank0(model.to(device), device)
        replicate.mark(model)
        return model
    if not (param_offload and device.type == "cuda"):
        model.to(device)
    broadcast_from_rank0(model, device)
    ignored = None
    if expert_parallel > 1:
        from hybridrl.distributed.expert_parallel import apply_expert_parallel

        ignored = set(apply_expert_parallel(fsdp_root(model), expert_parallel, device))
    model = apply_fsdp(model, device, param_offload=param_offload, mesh=mesh, ignored_params=ignored)
    from torch.distributed.fsdp import register_fsdp_forward_method

    for name in forward_methods:
        register_fsdp_forward_method(fsdp_root(model), name)
    return model


def broadcast_from_rank0(model: nn.Module, device: torch.device) -> None:
    """Every rank gets rank 0's weights before sharding: ranks build their models alone, and a
    random init (or a freshly initialized value head) differs per rank's RNG stream."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            buf = t.data if t.device.type == device.type else t.data.to(device)
            dist.broadcast(buf, src=0)
            if buf is not t.data:
                t.data.copy_(buf)


def apply_fsdp(
    model: nn.Module, device: torch.device, *, param_offload: bool = False, blocks_of=None, mesh=None, ignored_params=None
) -> nn.Module:
    """Shard `model` with FSDP2 over `mesh` (default: the active layout's): each transformer
    block, then the root.

    GPU: parameters are gathered in bf16 for compute, gradients reduced in fp32, the sharded
    master weights stay fp32. CPU (gloo): everything fp32. `param_offload` keeps the sharded
    parameters (and so their gradients and the optimizer step) in CPU memory; each block's
    parameters are copied to the device for its forward/backward (FSDP2's CPUOffloadPolicy).
    `ignored_params`: parameters FSDP leaves as they are (expert-parallel experts).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = mesh if mesh is not None else fsdp_mesh(device.type)
    if device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if param_offload and device.type == "cuda" else OffloadPolicy()
    kw = {"mesh": mesh, "mp_policy": mp, "offload_policy": offload, "ignored_params": ignored_params}
    for block in (blocks_of or _blocks)(model):
        fully_shard(block, **kw)
    fully_shard(fsdp_root(model), **kw)
    return model


@contextlib.contextmanager
def full_weights(model: nn.Module):
    """Inside: every FSDP unit of `model` holds its full (gathered) parameters and keeps them
    across forward calls, so a rank can run `generate` on its own prompts with no further
    collectives; ranks may then make different numbers of decoding steps. Resharded on exit."""
    if not is_sharded(model):
        yield model
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in fsdp_root(model).modules() if isinstance(m, FSDPModule)]
    for u in units:
        u.set_reshard_after_forward(False, recurse=False)
        u.unshard()
    try:
        yield model
    finally:
        for u in units:
            u.reshard()
            u.set_reshard_after_forward(True, recurse=False)


@contextlib.contextmanager
def accumulation(model: nn.Module, micro_batches: int, *, reduce_grads_once: bool = False, reshard_after_forward: bool = True):
    """Around one optimizer step's micro-batches (fsdp_config.reduce_grads_once /
    reshard_after_forward). Yields `before(i)`, to call before micro-batch i's forward.

    - `reduce_grads_once`: the gradients are reduce-scattered once, in the last micro-batch's
      backward, instead of in every one; until then each rank accumulates the full unsharded
      gradient (4 bytes a parameter). The same gradient up to the order of float additions.
    - `reshard_after_forward=False`: a block's gathered weights stay from its forward to its
      backward, so the backward does not gather them again; FSDP frees them after the backward.

    No effect on an unsharded model."""
    if (not reduce_grads_once and reshard_after_forward) or not is_sharded(model):
        yield lambda i: None
        return
    from torch.distributed.fsdp import FSDPModule

    root = fsdp_root(model)
    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    if not reshard_after_forward:
        for u in units:
            u.set_reshard_after_forward(False, recurse=False)

    def before(i: int) -> None:
        if reduce_grads_once:
            root.set_requires_gradient_sync(i == micro_batches - 1)

    try:
        yield before
    finally:
        if reduce_grads_once:
            root.set_requires_gradient_sync(True)
        if not reshard_after_forward:
            for u in units:
                u.reshard()
                u.set_reshard_after_forward(True, recurse=False)


def run_as_forward(model: nn.Module, fn, *args, **kwargs):
    """`fn(model, *args, **kwargs)` run as a forward of `model`. A pass that calls the model's
    submodules directly (the packed log-probs: decoder, then the LM head's weight) would find the
    root unit's weights (embeddings, final norm, LM head) still sharded; FSDP2 gathers them,
    and reduce-scatters their gradients after the backward, around `forward` and around methods
    registered with `register_fsdp_forward_method`, so `fn` is registered as one. Plain call
    when `model` is not sharded."""
    if not is_sharded(model):
        return fn(model, *args, **kwargs)
    root, name = fsdp_root(model), f"_hybridrl_forward_{fn.__name__}"
    if name not in root.__dict__:
        from torch.distributed.fsdp import register_fsdp_forward_method

        setattr(root, name, functools.partial(fn, model))
        register_fsdp_forward_method(root, name)
    return getattr(root, name)(*args, **kwargs)


def full_named_parameters(model: nn.Module):
    """(name, tensor) of every parameter, FSDP shards gathered into full tensors one parameter
    at a time (`DTensor.full_tensor`, a collective: every rank must consume the iterator, in the
    same order); the parameters themselves when not sharded."""
    from torch.distributed.tensor import DTensor

    for name, p in model.named_parameters():
        p = p.detach()
        yield name, (p.full_tensor() if isinstance(p, DTensor) else p)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip to `max_norm` by the global L2 norm of all gradients (over every rank's shards);
    returns that norm, the same number on every rank."""
    return float(clip_grad_norm_on_device(params, max_norm))


def clip_grad_norm_on_device(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """clip_grad_norm without reading the norm on the host: a 0-dim tensor on the gradients'
    device (a non-finite norm leaves non-finite gradients: the caller must not step on them).
    Plain (non-DTensor) gradients are whole: one device's, or a replicated model's after
    `replicate.average_gradients` (identical on every rank), so their local norm is the global one.
    DTensor gradients of several meshes (expert-parallel experts beside FSDP's shards) are normed
    per mesh and combined."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else "cpu")
    meshes: dict = {}
    for g in grads:
        meshes.setdefault(getattr(g, "device_mesh", None), []).append(g)
    if len(meshes) > 1:
        return _clip_over_meshes(list(meshes.values()), grads, max_norm)
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_([p for p in params if p.grad is not None], max_norm, total)
    if hasattr(total, "full_tensor"):  # DTensor grads: combine the ranks' partial norms
        total = total.full_tensor()
    return total


def _clip_over_meshes(groups: list[list[torch.Tensor]], grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    norms = []
    for gs in groups:
        n = torch.nn.utils.get_total_norm(gs, 2.0)
        norms.append(n.full_tensor() if hasattr(n, "full_tensor") else n)
    total = torch.linalg.vector_norm(torch.stack(norms))
    if math.isfinite(max_norm):
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        torch._foreach_mul_([g.to_local() if hasattr(g, "to_local") else g for g in grads], coef)
    return total


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move the optimizer's state tensors (Adam moments) to `device` (optimizer_offload)."""
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":
                state[k] = v.to(device, non_blocking=True)


def copy_weights(src: nn.Module, dst: nn.Module) -> None:
    """Copy parameters and buffers of `src` into `dst`, built and sharded the same way (each
    rank copies its own shards: no communication)."""
    with torch.no_grad():
        for a, b in zip(src.parameters(), dst.parameters(), strict=True):
            b.copy_(a)
        for a, b in zip(src.buffers(), dst.buffers(), strict=True):
            b.copy_(a)
