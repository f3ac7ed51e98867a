"""Expert parallelism for training a mixture of experts (`actor.fsdp_config.expert_parallel_size`).

The data-parallel ranks form a 2-D mesh (edp, ep): each group of `ep` consecutive ranks splits
every sparse layer's experts, rank i of the group holding experts [i E/ep, (i+1) E/ep) whole;
the `edp` groups hold copies. The expert weights are DTensors sharded on dim 0 over "ep"
(replicated over "edp"), kept out of FSDP (`fsdp.apply_fsdp(ignored_params=...)`); the dense
parts (attention, norms, router, embeddings) stay FSDP2-sharded over all ranks. DTensors keep
checkpoints (DCP), the weight sync (`full_tensor`) and the resharder (dim-0 pieces) unchanged.

A sparse layer's forward (`AllToAllExperts`, installed as the blocks' dispatcher):
1. route the rank's own tokens (router replicated), sort the (token, slot) assignments by expert;
2. all-to-all the counts, then the rows: each rank receives the rows of its experts from every
   rank of its group;
3. one grouped GEMM over its experts (`moe.grouped_swiglu`);
4. all-to-all the outputs back; each token sums its k weighted rows.
The all-to-alls are differentiable (their backward is the reverse exchange), so an expert's
gradient collects every token of its group that chose it.

Gradients: a rank's loss is scaled for FSDP's average over the world (`fsdp.dp_normalizer`), so
the dense gradients come out as one device's. An expert's local gradient sums the contributions
of its group's ranks; `reduce_expert_gradients` (once per optimizer step, before clipping) adds
the edp copies' and divides by the world size, which makes it one device's too. EP = 2 gives
the loss and gradients of EP = 1 (tests/distributed/test_expert_parallel.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.distributed.layout import world_size
from hybridrl.models import moe, moe_block


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Rows of x (sum in_splits, ...) to the group's ranks, in_splits[r] to rank r; returns what
    arrives, out_splits[r] rows from rank r. Differentiable."""
    from torch.distributed.nn.functional import all_to_all_single

    out = x.new_empty(sum(out_splits), *x.shape[1:])
    return all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)


class AllToAllExperts:
    """The sparse blocks' dispatcher under expert parallelism (see the module docstring)."""

    def __init__(self, mesh, n_local: int):
        self.mesh, self.n_local = mesh, n_local
        self.group, self.size, self.rank = mesh.get_group("ep"), mesh.size(1), mesh.get_local_rank("ep")
        self.replicas = mesh.get_group("edp") if mesh.size(0) > 1 else None
        self.params: list[nn.Parameter] = []  # every sparse layer's expert weights (DTensors)

    def __call__(self, x, ids, weights, experts, state) -> torch.Tensor:
        dev = x.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        N, k = ids.shape
        E, n = self.n_local * self.size, self.n_local
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)  # (N*k,) by expert, hence by the rank holding it
        counts = torch.zeros(E, dtype=torch.long, device=x.device).scatter_add_(0, flat, torch.ones_like(flat))
        arriving = torch.empty_like(counts)  # (ep, n): rows each rank sends to each of this rank's experts
        dist.all_to_all_single(arriving, counts, group=self.group)
        sizes = torch.stack([counts.view(self.size, n).sum(1), arriving.view(self.size, n).sum(1)]).tolist()
        send, recv = sizes
        with torch.autocast(dev, enabled=False):
            xs = x.to(dt).repeat_interleave(k, dim=0)[order]  # (N*k, H)
            xr = _all_to_all(xs, recv, send, self.group)  # (M, H): from rank 0, 1, ..., each by local expert
            local = torch.arange(n, device=x.device).repeat(self.size).repeat_interleave(arriving)  # (M,)
            perm = local.argsort(stable=True)
            gate_up = experts.gate_up_proj.to_local().to(dt)
            down = experts.down_proj.to_local().to(dt)
            ys = moe.grouped_swiglu(xr[perm], arriving.view(self.size, n).sum(0), gate_up, down, moe.pick_impl(state.impl, xr))
            yr = torch.empty_like(ys).index_copy(0, perm, ys)  # in the order the rows arrived
            yb = _all_to_all(yr, send, recv, self.group)  # (N*k, H) back, in `order`
            y = torch.empty_like(yb).index_copy(0, order, yb).view(N, k, -1)
            acc = torch.float64 if y.dtype == torch.float64 else torch.float32
            return (y.to(acc) * weights.to(acc)[..., None]).sum(1).to(x.dtype)

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Each expert's gradient as one device's: the edp copies' summed, divided by the world."""
        grads = [p.grad.to_local() for p in self.params if p.grad is not None]
        if not grads:
            return
        if self.replicas is not None:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.replicas)
            for g, part in zip(grads, flat.split([g.numel() for g in grads])):
                g.copy_(part.view_as(g))
        torch._foreach_div_(grads, float(world_size()))


def apply_expert_parallel(model: nn.Module, ep: int, device: torch.device) -> list[nn.Parameter]:
    """Split the experts of `model`'s sparse blocks (`moe_block.adopt` ran) over groups of `ep`
    ranks (every rank of the process group calls it, after the weights are the same everywhere);
    returns the expert parameters, for FSDP to leave alone."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    state = moe_block.state_of(model)
    if state is None:
        arch = (getattr(getattr(model, "config", None), "architectures", None) or ["?"])[0]
        raise ValueError(
            f"actor_rollout_ref.actor.fsdp_config.expert_parallel_size={ep} splits a mixture of experts' experts, and "
            f"{arch} has no sparse layers; set expert_parallel_size=1"
        )
    world = world_size()
    if world % ep or state.n_experts % ep:
        raise ValueError(
            f"actor_rollout_ref.actor.fsdp_config.expert_parallel_size={ep} must divide the {world} ranks and the "
            f"model's {state.n_experts} experts"
        )
    mesh = init_device_mesh(device.type, (world // ep, ep), mesh_dim_names=("edp", "ep"))
    n = state.n_experts // ep
    dispatch = AllToAllExperts(mesh, n)
    first = dispatch.rank * n
    for block in (m for m in model.modules() if isinstance(m, moe_block.SparseMoeBlock)):
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(block.experts, name)
            local = full.detach()[first : first + n].to(device).clone()
            shard = DTensor.from_local(local, mesh, [Replicate(), Shard(0)], run_check=False)
            param = nn.Parameter(shard, requires_grad=full.requires_grad)
            setattr(block.experts, name, param)
            dispatch.params.append(param)
    state.dispatch = dispatch
    return dispatch.params


def reduce_expert_gradients(model: nn.Module) -> None:
    """`AllToAllExperts.reduce_gradients` of an expert-parallel model (a collective; once per
    optimizer step, before clipping); nothing for any other model."""
    state = moe_block.state_of(model)
    if state is not None and isinstance(state.dispatch, AllToAllExperts):
        state.dispatch.reduce_gradients()
