"""Which processes each role gets, and where they go on the Ray cluster.

A pool is a set of ranks (one process per device) forming one `torch.distributed` group.
Colocated (the default): one pool holds every role, so each process carries the actor,
rollout, reference, critic and reward model of its device. Split (`resource_pool.critic`,
`resource_pool.reward_model`, `resource_pool.rollout` or verl's `reward_model.enable_resource_pool`
set): that role gets a pool of its own on separate devices, and its calls overlap the actor's.

Each pool takes `per_node` devices on each of `nnodes` nodes: one Ray placement group of
`nnodes` bundles of `per_node` devices each, spread one bundle per node (STRICT_SPREAD), so
ranks n*per_node .. (n+1)*per_node-1 share node n and NCCL can use its links, and no two
bundles share a node even where one node could hold both. On `trainer.device=cpu` a device is
a CPU worker process.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTOR, CRITIC, REWARD_MODEL, ROLLOUT = "actor_rollout_ref", "critic", "reward_model", "rollout"


@dataclass(frozen=True)
class PoolSpec:
    name: str
    roles: tuple[str, ...]
    per_node: int
    nnodes: int

    @property
    def world(self) -> int:
        return self.per_node * self.nnodes


def own_pool(cfg, role: str) -> tuple[int, int] | None:
    """(devices per node, nodes) of a role placed apart from the actor, or None when colocated."""
    if role == CRITIC and cfg.resource_pool.critic:
        return cfg.resource_pool.critic, cfg.trainer.nnodes
    if role == ROLLOUT and cfg.resource_pool.rollout:
        return cfg.resource_pool.rollout, cfg.trainer.nnodes
    return cfg.reward_model_pool if role == REWARD_MODEL else None


def pool_specs(cfg, roles: list[str]) -> list[PoolSpec]:
    """The pools of a run with these roles (ACTOR; CRITIC when a critic is trained; REWARD_MODEL; ROLLOUT)."""
    t, pool = cfg.trainer, cfg.resource_pool
    actor_per_node = pool.actor_rollout_ref or t.n_gpus_per_node
    apart = {role: own_pool(cfg, role) for role in roles if own_pool(cfg, role)}
    if not apart:
        return [PoolSpec("colocated", tuple(roles), actor_per_node, t.nnodes)]
    shared = tuple(r for r in roles if r not in apart)
    return [PoolSpec(ACTOR, shared, actor_per_node, t.nnodes)] + [PoolSpec(r, (r,), n, nodes) for r, (n, nodes) in apart.items()]


def bundle(device_type: str, devices: int = 1) -> dict[str, float]:
    """The resources of `devices` ranks' processes (one node's share of a pool)."""
    return {"GPU": float(devices), "CPU": float(devices)} if device_type == "cuda" else {"CPU": float(devices)}


def missing_resources(specs: list[PoolSpec], device_type: str, nodes: list[dict]) -> str | None:
    """What the cluster lacks for these pools, in words; None when it fits.

    `nodes` are `ray.nodes()` entries. Every pool wants `per_node` devices on each of
    `nnodes` nodes, so each of `nnodes` nodes must hold the pools' per-node total.
    """
    kind = "GPU" if device_type == "cuda" else "CPU"
    need_per_node = sum(s.per_node for s in specs)
    nnodes = max(s.nnodes for s in specs)
    alive = [n for n in nodes if n.get("Alive", True)]
    have = sorted(((int(n.get("Resources", {}).get(kind, 0)), n.get("NodeManagerAddress", "?")) for n in alive), reverse=True)
    fitting = [h for h in have if h[0] >= need_per_node]
    if len(fitting) >= nnodes:
        return None
    layout = " + ".join(f"{s.per_node} ({s.name})" for s in specs)
    seen = ", ".join(f"{addr}: {n} {kind}" for n, addr in have) or "none"
    most = have[0][0] if have else 0
    if nnodes > 1:
        hint = "start Ray on the missing nodes with `ray start --address=<head>:6379` (docs/distributed.md)"
    elif most == 0:
        hint = f"the cluster has no {kind}s: use trainer.device=cpu, or join a cluster that has them (ray_init.address)"
    else:
        hint = f"lower trainer.n_gpus_per_node to at most {most} (with resource_pool, their sum)"
    return (
        f"the config asks for {nnodes} node(s) with {layout} = {need_per_node} {kind}s each (trainer.nnodes x "
        f"trainer.n_gpus_per_node, resource_pool), but the Ray cluster has {len(fitting)} such node(s); "
        f"nodes seen: {seen}. Missing: {nnodes - len(fitting)} node(s) with {need_per_node} {kind}s; {hint}"
    )
