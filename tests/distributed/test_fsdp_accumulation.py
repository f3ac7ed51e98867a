"""fsdp_config.reduce_grads_once and reshard_after_forward (`fsdp.accumulation`, issue 40) on CPU (gloo,
2 Ray worker processes): one optimizer step over three micro-batches of unequal sizes gives the same
weights with each setting as with the defaults and as one device in float64, while the collectives
counted show what each setting saves: one reduce-scatter per FSDP unit for the whole step instead of
one per micro-batch, and no second all-gather in the backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import SHAPE

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.models.tiny import tiny_qwen2

pytestmark = pytest.mark.slow

VOCAB, ROWS, T = 40, 12, 7
MICROS = ((0, 1), (1, 4), (4, 6))  # each rank's 6 rows in micro-batches of 1, 3 and 2 rows
SETTINGS = {
    "defaults": {},
    "reduce_grads_once": {"reduce_grads_once": True},
    "keep_gathered": {"reshard_after_forward": False},
    "both": {"reduce_grads_once": True, "reshard_after_forward": False},
}


class Idle:
    def __init__(self, cfg, plan, device):
        pass

    @register(Dispatch.ALL)
    def noop(self) -> None:
        return None


def _model(dtype=torch.float32):
    return tiny_qwen2(VOCAB, dtype=dtype, **SHAPE)


def _batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, VOCAB, (ROWS, T), generator=g)
    lengths = torch.tensor([6, 2, 5, 1, 6, 3, 4, 6, 2, 5, 3, 6])
    return ids, (torch.arange(T - 1) < lengths[:, None]).float()


def _nll(model, ids, mask):
    logits = model(ids).logits[:, :-1]
    nll = F.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll.view(mask.shape).double() * mask).sum()


def _counting(counts: dict[str, int]):
    """Wrap torch.distributed's all-gather and reduce-scatter entry points (FSDP2 calls them through
    the module) with counters; returns a function that restores them."""
    import torch.distributed as dist

    saved = {}
    for name in ("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor", "reduce_scatter_single"):
        fn = getattr(dist, name, None)
        if fn is None:
            continue
        kind = "all_gather" if name.startswith("all_gather") else "reduce_scatter"

        def wrapped(*a, _fn=fn, _kind=kind, **kw):
            counts[_kind] += 1
            return _fn(*a, **kw)

        saved[name] = fn
        setattr(dist, name, wrapped)
    return lambda: [setattr(dist, n, f) for n, f in saved.items()]


def _step_on_rank(pool, rank, settings):
    """One SGD step over this rank's 6 rows in 3 micro-batches, for each setting from the same
    initial weights; {setting: (full weights, {all_gather: n, reduce_scatter: n})}."""
    import torch.distributed as dist

    from hybridrl.config.layout import build_layout
    from hybridrl.distributed import fsdp
    from hybridrl.distributed.layout import activate, fsdp_mesh

    layout = build_layout(dist.get_world_size(), -1)
    activate(layout)
    ids, mask = _batch()
    ids, mask = ids.chunk(2)[fsdp.dp_rank()], mask.chunk(2)[fsdp.dp_rank()]
    out = {}
    for name, kw in settings.items():
        torch.manual_seed(0)
        model = fsdp.place(_model(), torch.device("cpu"), mesh=fsdp_mesh("cpu", layout))
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        total = fsdp.dp_normalizer(float(mask.sum()))
        counts = {"all_gather": 0, "reduce_scatter": 0}
        restore = _counting(counts)
        try:
            with fsdp.accumulation(model, len(MICROS), **kw) as before:
                for i, (a, b) in enumerate(MICROS):
                    before(i)
                    (_nll(model, ids[a:b], mask[a:b]) / total).backward()
        finally:
            restore()
        opt.step()
        out[name] = ({n: t.clone() for n, t in fsdp.full_named_parameters(model)}, counts)
    return out


def _one_device():
    torch.manual_seed(0)
    model = _model(torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids, mask = _batch()
    (_nll(model, ids, mask) / mask.sum()).backward()
    opt.step()
    return dict(model.named_parameters())


def test_reduce_grads_once_and_keeping_gathered_weights_change_the_collectives_not_the_step(
    ray_session, tiny_model_dir, arith_data
):
    from ray import cloudpickle

    from hybridrl.distributed.ray_backend import RayBackend

    cloudpickle.register_pickle_by_value(__import__(__name__))
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 2, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir}, "actor": {"ppo_mini_batch_size": 2}},
            "trainer": {"device": "cpu", "n_gpus_per_node": 2, "logger": ["jsonl"]},
        }
    )
    backend = RayBackend(cfg, plan_batches(cfg), {"idle": Idle})
    try:
        per_rank = backend.run_on_hosts(_step_on_rank, SETTINGS)
    finally:
        backend.shutdown()
    ref = _one_device()
    for runs in per_rank:
        base_weights, base = runs["defaults"]
        for name, (weights, counts) in runs.items():
            for k, w in weights.items():
                torch.testing.assert_close(w, base_weights[k], rtol=1e-6, atol=1e-7, msg=f"{name} {k}")
                torch.testing.assert_close(w.double(), ref[k].detach(), rtol=1e-4, atol=1e-5, msg=f"{name} {k}")
        units = base["reduce_scatter"] // len(MICROS)
        assert units >= 2 and base["reduce_scatter"] == units * len(MICROS)  # one per unit and micro-batch
        assert runs["reduce_grads_once"][1]["reduce_scatter"] == units  # once per unit, for the whole step
        assert runs["both"][1]["reduce_scatter"] == units
        # the backward no longer gathers the blocks again
        assert runs["keep_gathered"][1]["all_gather"] < base["all_gather"]
        assert runs["keep_gathered"][1]["reduce_scatter"] == base["reduce_scatter"]
        assert runs["both"][1]["all_gather"] == runs["keep_gathered"][1]["all_gather"]


def test_the_options_are_no_ops_on_one_device():
    from hybridrl.distributed import fsdp

    model = _model()
    with fsdp.accumulation(model, 3, reduce_grads_once=True, reshard_after_forward=False) as before:
        before(0)
    assert not fsdp.is_sharded(model)
