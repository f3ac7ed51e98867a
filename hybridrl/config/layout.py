"""The parallel layout a config asks for: how a role's devices split into parallel dimensions.

Sizes only (no process groups): built once per role by `plan_batches` (each `RolePlan.layout`),
read by the runtime (`hybridrl.distributed.layout` makes the device meshes from it), by the
`dp` dispatch and by `hybridrl explain`. Ranks are numbered row-major over the dimensions, as
`torch.distributed.device_mesh.init_device_mesh` numbers them:

    training  rank = (replicate * dp_shard + shard) * sp + sp_rank      world = dp_replicate x dp_shard x sp
    rollout   rank = replica * tp + tp_rank                             world = replicas x tp

Data parallel (dp = dp_replicate x dp_shard = world / sp) is what batches are split over:
the sp ranks of one dp group see the same sequences. FSDP shards parameters within groups of
dp_shard (x sp) ranks and replicates them across the dp_replicate groups (HSDP when both are
> 1, verl's `fsdp_size`). The rollout runs world / tp replicas of tp consecutive ranks, each a
tensor-parallel native engine (`rollout.tensor_model_parallel_size`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLayout:
    world: int  # ranks (processes, one per device) of the role
    dp_replicate: int = 1  # HSDP: groups holding full replicas of the sharded model
    dp_shard: int = 0  # FSDP shard group size; 0 = world / (dp_replicate x sp)
    sp: int = 1  # sequence-parallel (Ulysses) ranks sharing one sequence batch
    tp: int = 1  # rollout tensor-parallel size: ranks per rollout replica

    def __post_init__(self):
        if self.dp_shard == 0:
            object.__setattr__(self, "dp_shard", self.world // max(self.dp_replicate * self.sp, 1))
        if self.dp_replicate * self.dp_shard * self.sp != self.world:
            raise ValueError(
                f"parallel layout: dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x sp "
                f"{self.sp} != world {self.world}"
            )
        if self.world % self.tp:
            raise ValueError(f"parallel layout: tp {self.tp} does not divide world {self.world}")

    @property
    def dp(self) -> int:
        """The data-parallel size: how many different batch shards a step is split into."""
        return self.dp_replicate * self.dp_shard

    @property
    def hsdp(self) -> bool:
        return self.dp_replicate > 1 and self.dp_shard * self.sp > 1

    @property
    def replicated(self) -> bool:
        """Full replicas on several ranks, no sharding (fsdp_size=1): plain data parallel with
        gradients averaged per optimizer step (`distributed/replicate.py`), no FSDP."""
        return self.world > 1 and self.dp_shard * self.sp == 1

    @property
    def rollout_tp(self) -> int:
        """Ranks per rollout replica (each a tensor-parallel shard of the engine)."""
        return self.tp

    @property
    def rollout_replicas(self) -> int:
        return self.world // self.rollout_tp

    def dp_rank(self, rank: int) -> int:
        """The data-parallel group (batch shard) of a global rank."""
        return rank // self.sp

    def groups(self, dim: str) -> list[int]:
        """For each rank, the index of the batch shard it gets when a batch is split over `dim`:
        "dp" (training: the sp ranks of a group share a shard) or "rollout" (one shard per replica)."""
        per = {"dp": self.sp, "rollout": self.rollout_tp}.get(dim)
        if per is None:
            raise ValueError(f"unknown layout dimension {dim!r}; use 'dp' or 'rollout'")
        return [r // per for r in range(self.world)]

    def describe(self) -> str:
        """One line for `hybridrl explain`."""
        if self.dp_replicate == 1:
            fsdp = f"FSDP over {self.dp_shard * self.sp}" if self.dp_shard * self.sp > 1 else "no sharding"
        elif self.dp_shard * self.sp == 1:
            fsdp = f"{self.dp_replicate} full replicas (no FSDP; gradients all-reduced)"
        else:
            fsdp = f"HSDP: {self.dp_replicate} replicas x FSDP over {self.dp_shard * self.sp}"
        return (
            f"training {self.dp_replicate} x {self.dp_shard} x sp {self.sp} = {self.world} rank(s), dp {self.dp}, "
            f"{fsdp}; rollout {self.rollout_replicas} replica(s) x tp {self.rollout_tp}"
        )


def fsdp_shard_size(world: int, fsdp_size: int) -> int:
    """verl's `fsdp_size`, in ranks: -1 (or >= world) = shard over all ranks, else groups of that size."""
    return world if fsdp_size == -1 or fsdp_size >= world else fsdp_size


def build_layout(world: int, fsdp_size: int = -1, sp: int = 1, tp: int = 1) -> ParallelLayout:
    """The layout of a role on `world` ranks; ValueError when the sizes do not fit (config
    validation reports the same cases first, with a value that works: `layout_problem`)."""
    problem = layout_problem(world, fsdp_size, sp, tp)
    if problem:
        raise ValueError(f"{problem[0]}{problem[1]}; use e.g. {problem[0]}={problem[2]}")
    shard = fsdp_shard_size(world, fsdp_size)  # ranks per shard group (sp ranks included)
    return ParallelLayout(world=world, dp_replicate=world // shard, dp_shard=shard // sp, sp=sp, tp=tp)


def layout_problem(world: int, fsdp_size: int, sp: int = 1, tp: int = 1) -> tuple[str, str, int] | None:
    """(which size, what is wrong, a value that works) when the sizes cannot be laid out on
    `world` ranks; None when they can. `which` is "fsdp_size", "sp" or "tp"."""

    def divisor_near(x: int, ok) -> int:
        good = [d for d in range(1, world + 1) if ok(d)]
        return min(good, key=lambda d: (abs(d - x), -d))

    if sp < 1 or world % sp:
        return "sp", f"={sp} does not divide the role's {world} rank(s)", divisor_near(sp, lambda d: world % d == 0)
    if tp < 1 or world % tp:
        return "tp", f"={tp} does not divide the role's {world} rank(s)", divisor_near(tp, lambda d: world % d == 0)
    if fsdp_size == 1 and sp > 1 and world > 1:
        return (
            "fsdp_size",
            f"=1 replicates the model with no sharding, but sequence parallelism (sp={sp}) shards one model over "
            f"its {sp} sp ranks, so a shard group must be a multiple of {sp}",
            sp,
        )
    if fsdp_size != -1 and (fsdp_size < 1 or (fsdp_size < world and (world % fsdp_size or fsdp_size % sp))):
        fix = divisor_near(fsdp_size, lambda d: world % d == 0 and d % sp == 0)
        within = f" and be a multiple of the sequence-parallel size {sp}" if sp > 1 else ""
        return (
            "fsdp_size",
            f"={fsdp_size} must be -1 (shard over all ranks) or divide the role's {world} rank(s)"
            f"{within} (shard within groups of that size, replicate across them)",
            fix,
        )
    return None
