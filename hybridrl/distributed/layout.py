"""The parallel layout at run time: the process's `ParallelLayout` and the device meshes built from it.

The sizes come from the config, once (`plan_batches` puts each role's `ParallelLayout`, from
`hybridrl.config.layout`, in its `RolePlan`). A worker process activates its pool's layout when
its role is added (`ray_backend.WorkerHost.add_role`); on one device nothing is activated and
`active()` is the trivial layout of the process group (one rank, or the whole world sharded).
`fsdp.place` shards over `fsdp_mesh()`, `fsdp.dp_size()` / `dp_rank()` read `active()`, and the
worker groups split `dp` methods with `ParallelLayout.groups`.
"""

from __future__ import annotations

import torch.distributed as dist

from hybridrl.config.layout import ParallelLayout, build_layout

__all__ = ["ParallelLayout", "activate", "active", "build_layout", "fsdp_mesh", "plan_layout", "rollout_tp_group"]

_active: ParallelLayout | None = None


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def global_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def plan_layout(plan, role: str) -> ParallelLayout:
    """The layout of `role` ("critic", "reward_model", "rollout" or an actor role) in a BatchPlan."""
    if role == "critic" and plan.critic is not None:
        return plan.critic.layout
    if role == "reward_model" and plan.reward_model_layout is not None:
        return plan.reward_model_layout
    if role == "rollout" and plan.rollout_layout is not None:
        return plan.rollout_layout
    return plan.actor.layout


def activate(layout: ParallelLayout) -> None:
    """Make `layout` this process's layout (its world must be the process group's)."""
    global _active
    if layout.world != world_size():
        raise ValueError(f"layout of {layout.world} rank(s) activated in a process group of {world_size()}")
    _active = layout


def active() -> ParallelLayout:
    """This process's layout: the activated one, else every rank one data-parallel shard of a
    model sharded over all ranks (what the process group alone implies)."""
    if _active is not None and _active.world == world_size():
        return _active
    return ParallelLayout(world_size())


def rollout_tp_group(layout: ParallelLayout | None = None):
    """This rank's tensor-parallel process group of the rollout: ranks [k * tp, (k + 1) * tp) form
    replica k (`ParallelLayout.groups("rollout")`); None at tp = 1. Every rank of the process group
    must call it (it creates one group per replica, in the same order everywhere)."""
    layout = layout or active()
    tp = layout.rollout_tp
    if tp == 1:
        return None
    mine = None
    for first in range(0, layout.world, tp):
        group = dist.new_group(list(range(first, first + tp)))
        if first <= global_rank() < first + tp:
            mine = group
    return mine


def fsdp_mesh(device_type: str, layout: ParallelLayout | None = None):
    """The DeviceMesh FSDP2 shards over: 1-D ("dp_shard",) over all ranks, or 2-D
    ("dp_replicate", "dp_shard") when the layout replicates (HSDP: `fully_shard` all-reduces
    gradients across the first dimension and reduce-scatters them within the second). The sp
    ranks shard parameters too (their shard group is dp_shard x sp ranks). Creating a mesh
    creates process groups: a collective, every rank must call it."""
    from torch.distributed.device_mesh import init_device_mesh

    layout = layout or active()
    shard = layout.dp_shard * layout.sp
    if layout.dp_replicate == 1:
        return init_device_mesh(device_type, (shard,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(device_type, (layout.dp_replicate, shard), mesh_dim_names=("dp_replicate", "dp_shard"))
