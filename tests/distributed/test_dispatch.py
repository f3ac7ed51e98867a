"""Dispatch split/collect and placement arithmetic: pure functions, no processes."""

from types import SimpleNamespace

import pytest
import torch

from hybridrl.data.batch import Batch
from hybridrl.distributed.dispatch import Dispatch, collect_outputs, register, split_inputs
from hybridrl.distributed.resource_pool import ACTOR, CRITIC, missing_resources, pool_specs


@pytest.mark.parametrize("rows, world", [(6, 2), (5, 2), (7, 3), (1, 2)])
def test_dp_split_then_collect_is_the_identity_in_order(rows, world):
    batch = Batch({"x": torch.arange(rows)}, {"s": [f"r{i}" for i in range(rows)]})
    per_args, per_kwargs, pad = split_inputs(Dispatch.DP, world, (batch, "same"), {"b": batch})
    assert pad == (-rows) % world
    assert [len(a[0]) for a in per_args] == [(rows + pad) // world] * world
    assert all(a[1] == "same" for a in per_args) and all(len(kw["b"]) == len(a[0]) for a, kw in zip(per_args, per_kwargs))
    # each rank answers for its own rows; the gathered answer is in input order, padding dropped
    outs = [Batch({"y": a[0]["x"] * 10}, {"s": a[0]["s"]}) for a in per_args]
    out = collect_outputs(Dispatch.DP, outs, pad)
    assert out["y"].tolist() == [10 * i for i in range(rows)]
    assert list(out["s"]) == [f"r{i}" for i in range(rows)]


def test_dp_metrics_are_averaged_and_refuse_padding():
    assert collect_outputs(Dispatch.DP, [{"a": 1.0, "b": 4.0}, {"a": 3.0, "b": 4.0}], 0) == {"a": 2.0, "b": 4.0}
    with pytest.raises(ValueError, match="padding rows"):
        collect_outputs(Dispatch.DP, [{"a": 1.0}, {"a": 1.0}], 1)


def test_all_and_rank0():
    args, kwargs, pad = split_inputs(Dispatch.ALL, 3, (1,), {"k": 2})
    assert args == [(1,)] * 3 and kwargs == [{"k": 2}] * 3 and pad == 0
    assert collect_outputs(Dispatch.ALL, ["a", "b", "c"], 0) == ["a", "b", "c"]
    assert collect_outputs(Dispatch.RANK0, ["a", "b", "c"], 0) == "a"


def _cfg(gpus=4, nnodes=1, actor=None, critic=None):
    return SimpleNamespace(
        trainer=SimpleNamespace(n_gpus_per_node=gpus, nnodes=nnodes),
        resource_pool=SimpleNamespace(actor_rollout_ref=actor, critic=critic),
    )


def test_pools_colocated_and_split():
    (pool,) = pool_specs(_cfg(4, 2), [ACTOR, CRITIC])
    assert pool.roles == (ACTOR, CRITIC) and pool.world == 8
    actor, critic = pool_specs(_cfg(4, 2, actor=3, critic=1), [ACTOR, CRITIC])
    assert (actor.roles, actor.world, critic.roles, critic.world) == ((ACTOR,), 6, (CRITIC,), 2)


def test_missing_resources_says_what_is_missing():
    def node(ip, gpus):
        return {"Alive": True, "NodeManagerAddress": ip, "Resources": {"GPU": gpus, "CPU": 32}}

    specs = pool_specs(_cfg(8, 2), [ACTOR])
    assert missing_resources(specs, "cuda", [node("10.0.0.1", 8), node("10.0.0.2", 8)]) is None
    msg = missing_resources(specs, "cuda", [node("10.0.0.1", 8), node("10.0.0.2", 4)])
    assert "2 node(s) with 8 (colocated) = 8 GPUs each" in msg and "10.0.0.2: 4 GPU" in msg
    assert "Missing: 1 node(s) with 8 GPUs" in msg and "ray start --address" in msg
    one = missing_resources(pool_specs(_cfg(4), [ACTOR]), "cuda", [node("10.0.0.1", 2)])
    assert "lower trainer.n_gpus_per_node to at most 2" in one
    none = missing_resources(pool_specs(_cfg(2), [ACTOR]), "cuda", [node("10.0.0.1", 0)])
    assert "the cluster has no GPUs: use trainer.device=cpu" in none


def test_ragged_responses_are_right_padded_to_the_widest_rank():
    """Each rank's generation ends at its own longest response; one device pads to the longest."""
    meta = {"pad_token_id": 7}
    a = Batch({"responses": torch.tensor([[1, 2, 3]]), "response_mask": torch.ones(1, 3), "p": torch.zeros(1, 2)}, meta=meta)
    b = Batch({"responses": torch.tensor([[4, 5]]), "response_mask": torch.ones(1, 2), "p": torch.zeros(1, 2)}, meta=meta)
    out = collect_outputs(Dispatch.DP, [a, b], 0)
    assert out["responses"].tolist() == [[1, 2, 3], [4, 5, 7]]
    assert out["response_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert out["p"].shape == (2, 2)


def test_dp_split_over_the_layout_shares_a_chunk_within_an_sp_group():
    """sp = 2 on 4 ranks: 2 data-parallel shards; ranks 0, 1 get the first half, 2, 3 the second,
    and the gathered answer takes one output per shard (its first rank's)."""
    from hybridrl.config.layout import build_layout

    layout = build_layout(4, -1, sp=2)
    assert layout.groups("dp") == [0, 0, 1, 1] and layout.groups("rollout") == [0, 1, 2, 3]
    batch = Batch({"x": torch.arange(5)})
    per_args, _, pad = split_inputs(Dispatch.DP, layout.groups("dp"), (batch,), {})
    assert pad == 1 and [a[0]["x"].tolist() for a in per_args] == [[0, 1, 2], [0, 1, 2], [3, 4, 0], [3, 4, 0]]
    outs = [Batch({"y": a[0]["x"] * 10 + r}) for r, a in enumerate(per_args)]  # + r: which rank answered
    out = collect_outputs(Dispatch.DP, outs, pad, layout.groups("dp"))
    assert out["y"].tolist() == [0, 10, 20, 32, 42]  # rows 0-2 from rank 0, rows 3-4 from rank 2
    metrics = [{"a": 1.0}, {"a": 1.0}, {"a": 4.0}, {"a": 4.0}]
    assert collect_outputs(Dispatch.DP, metrics, 0, layout.groups("dp")) == {"a": 2.5}
    # every rank in one shard: no split, one answer
    args, _, pad = split_inputs(Dispatch.DP, [0, 0], (batch,), {})
    assert pad == 0 and args == [(batch,), (batch,)]


def test_register_names_the_mesh():
    from hybridrl.distributed.dispatch import dispatch_mesh, dispatch_mode

    @register(Dispatch.DP, mesh="rollout")
    def generate(batch):
        return batch

    @register(Dispatch.DP)
    def update(batch):
        return batch

    assert (dispatch_mode(generate), dispatch_mesh(generate)) == (Dispatch.DP, "rollout")
    assert (dispatch_mode(update), dispatch_mesh(update)) == (Dispatch.DP, "dp")
    with pytest.raises(ValueError, match="unknown mesh 'tp'"):
        register(Dispatch.DP, mesh="tp")
