"""The parallel layout a config asks for: sizes by hand, impossible layouts named with a fix, explain."""

import pytest

from hybridrl.config import explain_text, find_problems, load_config, plan_batches
from hybridrl.config.layout import ParallelLayout, build_layout, layout_problem

REQUIRED = ["actor_rollout_ref.model.path=models/tiny", "data.train_files=data/train.parquet"]
A = "actor_rollout_ref.actor"
FSDP_SIZE = f"{A}.fsdp_config.fsdp_size"


def load(*overrides, check=True):
    return load_config(None, [*REQUIRED, "data.train_batch_size=16", f"{A}.ppo_mini_batch_size=8", *overrides], check=check)


@pytest.mark.parametrize(
    "world, fsdp_size, sp, replicate, shard, dp",
    [
        (1, -1, 1, 1, 1, 1),
        (4, -1, 1, 1, 4, 4),  # FSDP over all ranks
        (4, 8, 1, 1, 4, 4),  # larger than the world: all ranks (verl)
        (4, 2, 1, 2, 2, 4),  # HSDP 2 x 2
        (4, 1, 1, 4, 1, 4),  # 4 unsharded replicas
        (8, 4, 2, 2, 2, 4),  # shard groups of 4 ranks = 2 dp x 2 sp; dp = world / sp
    ],
)
def test_build_layout_by_hand(world, fsdp_size, sp, replicate, shard, dp):
    layout = build_layout(world, fsdp_size, sp=sp)
    assert (layout.dp_replicate, layout.dp_shard, layout.sp, layout.dp) == (replicate, shard, sp, dp)
    assert [layout.dp_rank(r) for r in range(world)] == [r // sp for r in range(world)]


def test_the_rollout_runs_world_over_tp_replicas_of_consecutive_ranks():
    layout = build_layout(4, -1, tp=2)
    assert layout.tp == 2 and (layout.rollout_replicas, layout.rollout_tp) == (2, 2)
    assert layout.groups("rollout") == [0, 0, 1, 1]
    assert layout.describe().endswith("; rollout 2 replica(s) x tp 2")


@pytest.mark.parametrize(
    "world, fsdp_size, sp, tp, which, fix",
    [
        (4, 3, 1, 1, "fsdp_size", 4),
        (6, 4, 1, 1, "fsdp_size", 3),
        (4, 0, 1, 1, "fsdp_size", 1),
        (8, 2, 4, 1, "fsdp_size", 4),  # a shard group must hold whole sp groups
        (4, -1, 3, 1, "sp", 4),
        (6, -1, 1, 4, "tp", 3),
    ],
)
def test_impossible_layouts_name_a_value_that_works(world, fsdp_size, sp, tp, which, fix):
    name, _, value = layout_problem(world, fsdp_size, sp, tp)
    assert (name, value) == (which, fix)
    fixed = {"fsdp_size": (fix, sp, tp), "sp": (fsdp_size, fix, tp), "tp": (fsdp_size, sp, fix)}[which]
    assert layout_problem(world, *fixed) is None
    with pytest.raises(ValueError, match=f"use e.g. {which}={fix}"):
        build_layout(world, fsdp_size, sp, tp)
    with pytest.raises(ValueError, match="!= world"):
        ParallelLayout(world=4, dp_replicate=3, dp_shard=1)


def test_fsdp_size_in_the_config_plans_hsdp_and_explain_shows_it():
    cfg = load("trainer.n_gpus_per_node=4", f"{FSDP_SIZE}=2")
    p = plan_batches(cfg)
    assert (p.actor.layout.dp_replicate, p.actor.layout.dp_shard, p.dp, p.actor.per_device_mini_batch) == (2, 2, 4, 2)
    text = explain_text(cfg)
    assert "layout: training 2 x 2 x sp 1 = 4 rank(s), dp 4, HSDP: 2 replicas x FSDP over 2; rollout 4 replica(s) x tp 1" in text
    assert "layout" not in explain_text(load())  # one device: nothing to lay out


def test_fsdp_size_that_does_not_divide_the_ranks_is_a_config_error():
    cfg = load("trainer.n_gpus_per_node=4", f"{FSDP_SIZE}=3", check=False)
    problems = [p for p in find_problems(cfg) if p.keys[0] == FSDP_SIZE]
    assert [p.message for p in problems] == [
        f"{FSDP_SIZE}=3 must be -1 (shard over all ranks) or divide the role's 4 rank(s) (shard within groups of that "
        f"size, replicate across them); use e.g. {FSDP_SIZE}=4"
    ]
    assert problems[0].fix == {FSDP_SIZE: 4}


def test_a_split_critic_is_laid_out_on_its_own_ranks():
    cfg = load(
        "algorithm.adv_estimator=gae",
        "trainer.n_gpus_per_node=8",
        "resource_pool.actor_rollout_ref=4",
        "resource_pool.critic=4",
        f"{FSDP_SIZE}=2",
        "critic.model.fsdp_config.fsdp_size=3",
        check=False,
    )
    msgs = [p.message for p in find_problems(cfg) if "fsdp_size" in p.message]
    assert msgs == [
        "critic.model.fsdp_config.fsdp_size=3 must be -1 (shard over all ranks) or divide the role's 4 "
        "rank(s) (shard within groups of that size, replicate across them); use e.g. "
        "critic.model.fsdp_config.fsdp_size=4"
    ]
    cfg.critic.model.fsdp_config.fsdp_size = 1
    p = plan_batches(cfg)
    assert (p.actor.layout.dp_replicate, p.actor.layout.dp_shard) == (2, 2)
    assert (p.critic.layout.world, p.critic.layout.dp_replicate, p.critic.layout.dp_shard) == (4, 4, 1)
    # colocated, the critic shares the actor's layout (its own fsdp_size does not apply)
    cfg = load(
        "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=4", f"{FSDP_SIZE}=2", "critic.model.fsdp_config.fsdp_size=3"
    )
    assert plan_batches(cfg).critic.layout == plan_batches(cfg).actor.layout


def test_explain_shows_the_layout_for_offline_algorithms_too():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs/dpo.yaml", ["trainer.n_gpus_per_node=2", f"{FSDP_SIZE}=1"])
    assert "layout: training 2 x 1 x sp 1 = 2 rank(s), dp 2, 2 full replicas (no FSDP; gradients all-reduced)" in explain_text(
        cfg
    )


def test_fsdp_size_1_on_several_ranks_is_replicated_and_the_default_is_not():
    assert build_layout(2, 1).replicated and build_layout(4, 1).replicated
    assert not build_layout(1, 1).replicated  # one rank: nothing to replicate over
    assert not build_layout(2, -1).replicated and not build_layout(4, 2).replicated  # FSDP, HSDP
    assert not plan_batches(load("trainer.n_gpus_per_node=2")).actor.layout.replicated  # the default stays FSDP


@pytest.mark.parametrize(
    "overrides, key",
    [
        ([f"{A}.fsdp_config.param_offload=true"], f"{A}.fsdp_config.param_offload"),
        (["actor_rollout_ref.ref.fsdp_config.param_offload=true"], "actor_rollout_ref.ref.fsdp_config.param_offload"),
        (
            ["algorithm.adv_estimator=gae", "critic.model.fsdp_config.param_offload=true"],
            "critic.model.fsdp_config.param_offload",
        ),
    ],
)
def test_param_offload_with_a_replicated_model_is_a_config_error(overrides, key):
    cfg = load("trainer.n_gpus_per_node=2", f"{FSDP_SIZE}=1", *overrides, check=False)
    problems = [p for p in find_problems(cfg) if p.keys[0] == key]
    assert [p.message for p in problems] == [
        f"{key}=true needs FSDP's sharded parameters, but {FSDP_SIZE}=1 replicates the whole model on each of the role's "
        f"2 ranks (no FSDP); use {key}=false, or {FSDP_SIZE}=-1 to shard"
    ]
    assert problems[0].fix == {key: False}
    # fine when sharded, on one device, and for optimizer_offload (it moves a whole model's moments too)
    for ok in (
        load("trainer.n_gpus_per_node=2", *overrides),
        load(f"{FSDP_SIZE}=1", *overrides),
        load("trainer.n_gpus_per_node=2", f"{FSDP_SIZE}=1", f"{A}.fsdp_config.optimizer_offload=true"),
    ):
        assert not [p for p in find_problems(ok) if "param_offload" in p.message]


def test_a_critic_on_its_own_ranks_is_checked_with_its_own_fsdp_size():
    common = ["algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=4", "resource_pool.actor_rollout_ref=2"]
    common += ["resource_pool.critic=2", "critic.model.fsdp_config.param_offload=true"]
    key = "critic.model.fsdp_config.param_offload"
    replicated = load(*common, "critic.model.fsdp_config.fsdp_size=1", check=False)
    assert [p.keys for p in find_problems(replicated) if p.keys[0] == key] == [(key, "critic.model.fsdp_config.fsdp_size")]
    assert not [p for p in find_problems(load(*common, f"{FSDP_SIZE}=1", check=False)) if p.keys[0] == key]


def test_fsdp_size_1_with_sequence_parallelism_names_the_conflict():
    cfg = load("trainer.n_gpus_per_node=4", f"{FSDP_SIZE}=1", f"{A}.ulysses_sequence_parallel_size=2", check=False)
    problems = [p for p in find_problems(cfg) if p.keys[0] == FSDP_SIZE]
    assert [p.message for p in problems] == [
        f"{FSDP_SIZE}=1 replicates the model with no sharding, but sequence parallelism (sp=2) shards one model over "
        f"its 2 sp ranks, so a shard group must be a multiple of 2; use e.g. {FSDP_SIZE}=2"
    ]
