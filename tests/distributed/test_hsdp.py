"""HSDP on CPU (gloo, 4 Ray worker processes): `actor.fsdp_config.fsdp_size=2` lays the 4 ranks out
as 2 replicas x 2 shards, and one training step (loss over the global token count, clipped global
gradient norm, SGD) gives the loss, gradient norm and updated weights of plain FSDP over the 4
ranks, of 4 whole replicas with no FSDP (fsdp_size=1: distributed/replicate.py), and of one device in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import SHAPE

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.models.tiny import tiny_qwen2

pytestmark = pytest.mark.slow

VOCAB, ROWS, T, CLIP = 40, 8, 7, 0.05


class Idle:
    """A role with nothing to do: the test runs its own function on the hosts."""

    def __init__(self, cfg, plan, device):
        pass

    @register(Dispatch.ALL)
    def noop(self) -> None:
        return None


def _model(dtype=torch.float32):
    return tiny_qwen2(VOCAB, dtype=dtype, **SHAPE)  # the package's function: Ray's workers import it


def _batch():
    """Token ids and a loss mask with rows of different lengths (rank shards hold unequal counts)."""
    g = torch.Generator().manual_seed(123)
    ids = torch.randint(2, VOCAB, (ROWS, T), generator=g)
    mask = (torch.arange(T - 1) < torch.tensor([6, 2, 5, 1, 6, 3, 4, 6])[:, None]).float()  # (ROWS, T-1)
    return ids, mask


def _loss_sum(model, ids, mask):
    logits = model(ids).logits[:, :-1]  # (B, T-1, V)
    nll = F.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll.view(mask.shape).double() * mask).sum()


def _step_on_rank(pool, rank, fsdp_size):
    """One step on this rank's dp shard with the layout fsdp_size gives; (loss, grad norm, full
    weights, mesh shape) on every rank."""
    import torch.distributed as dist

    from hybridrl.config.layout import build_layout
    from hybridrl.distributed import fsdp, replicate
    from hybridrl.distributed.layout import activate, fsdp_mesh

    layout = build_layout(dist.get_world_size(), fsdp_size)
    activate(layout)
    mesh = None if layout.replicated else fsdp_mesh("cpu", layout)
    model = fsdp.place(_model(), torch.device("cpu"), mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids, mask = _batch()
    shard = fsdp.dp_rank()
    ids, mask = ids.chunk(fsdp.dp_size())[shard], mask.chunk(fsdp.dp_size())[shard]
    local = _loss_sum(model, ids, mask)
    (local / fsdp.dp_normalizer(float(mask.sum()))).backward()
    replicate.average_gradients(model)  # what TrainEngine.step does first (a no-op under FSDP)
    norm = fsdp.clip_grad_norm(list(model.parameters()), CLIP)
    opt.step()
    total = torch.tensor([float(local), float(mask.sum())], dtype=torch.float64)
    dist.all_reduce(total)
    weights = {n: t.clone() for n, t in fsdp.full_named_parameters(model)}
    return float(total[0] / total[1]), norm, weights, tuple(mesh.shape) if mesh is not None else None


def _one_device():
    model = _model(torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ids, mask = _batch()
    loss = _loss_sum(model, ids, mask) / mask.sum()
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
    opt.step()
    return float(loss.detach()), norm, dict(model.named_parameters())


def test_hsdp_2x2_step_equals_fsdp_4_and_one_device(ray_session, tiny_model_dir, arith_data):
    from ray import cloudpickle

    from hybridrl.distributed.ray_backend import RayBackend

    cloudpickle.register_pickle_by_value(__import__(__name__))  # the functions travel by value
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": tiny_model_dir},
                "actor": {"ppo_mini_batch_size": 4, "fsdp_config": {"fsdp_size": 2}},
            },
            "trainer": {"device": "cpu", "n_gpus_per_node": 4, "logger": ["jsonl"]},
        }
    )
    plan = plan_batches(cfg)
    assert (plan.actor.layout.dp_replicate, plan.actor.layout.dp_shard, plan.dp) == (2, 2, 4)
    ref_loss, ref_norm, ref_weights = _one_device()
    assert ref_norm > CLIP  # the clip is exercised
    backend = RayBackend(cfg, plan, {"idle": Idle})
    try:
        runs = {size: backend.run_on_hosts(_step_on_rank, size) for size in (-1, 2, 1)}
    finally:
        backend.shutdown()
    assert [r[3] for r in runs[-1]] == [(4,)] * 4 and [r[3] for r in runs[2]] == [(2, 2)] * 4
    assert [r[3] for r in runs[1]] == [None] * 4  # no mesh: not sharded
    fsdp4 = runs[-1][0]
    for size, per_rank in runs.items():
        for loss, norm, weights, _ in per_rank:
            assert loss == pytest.approx(ref_loss, rel=1e-6), size
            assert norm == pytest.approx(ref_norm, rel=1e-5), size
            assert norm == pytest.approx(fsdp4[1], rel=1e-6), size
            for name, w in weights.items():
                torch.testing.assert_close(w, fsdp4[2][name], rtol=1e-6, atol=1e-7)
                torch.testing.assert_close(w.double(), ref_weights[name].detach(), rtol=1e-4, atol=1e-5)
