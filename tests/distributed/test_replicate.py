"""Replicated data parallel (`fsdp_config.fsdp_size=1`, distributed/replicate.py) on CPU (gloo, 2 Ray
worker processes), through the trainer's own `TrainEngine` (place, clipped AdamW step, DCP checkpoints):

- two optimizer steps of three unequal micro-batches give the losses, gradient norms and weights of
  FSDP over the same 2 ranks (fsdp_size=-1) and of one process;
- the model is not FSDP-wrapped (no DTensor parameter), and the rollout gets its weights with no
  gather: the engine may alias the policy; a tensor-parallel rollout cuts its slices locally;
- a checkpoint written after step 1 resumes step 2 exactly, replicated or sharded on either side,
  and loads into one process.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.distributed.dispatch import Dispatch, register

pytestmark = pytest.mark.slow

VOCAB, ROWS, T, CLIP, LR = 40, 12, 7, 0.5, 1e-2
MICROS = ((0, 1), (1, 4), (4, 6))  # each rank's 6 rows (one process: all 12, split the same way twice)


class Idle:
    def __init__(self, cfg, plan, device):
        pass

    @register(Dispatch.ALL)
    def noop(self) -> None:
        return None


def _batch(step: int):
    """Step `step`'s token ids and loss mask; rows of different lengths (ranks hold unequal counts)."""
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(2, VOCAB, (ROWS, T), generator=g)
    lengths = torch.randint(1, T, (ROWS,), generator=g)
    return ids, (torch.arange(T - 1) < lengths[:, None]).float()  # (ROWS, T-1)


def _nll(model, ids, mask):
    logits = model(ids).logits[:, :-1]  # (B, T-1, V)
    nll = F.cross_entropy(logits.reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1), reduction="none")
    return (nll.view(mask.shape) * mask).sum()


def train(pool, rank, fsdp_size: int, steps, load: str | None = None, save: str | None = None) -> dict:
    """Optimizer steps `steps` (indices into `_batch`) with the real TrainEngine, on this rank's dp
    shard of each batch; a checkpoint loaded first / saved after. Also the one-process run (pool and
    rank unused; no process group)."""
    import torch.distributed as dist

    from hybridrl.config.layout import build_layout
    from hybridrl.config.schema import ModelConfig, OptimConfig
    from hybridrl.distributed import fsdp, replicate
    from hybridrl.distributed.layout import activate, world_size
    from hybridrl.models.tiny import tiny_qwen2
    from hybridrl.workers.engine import TrainEngine
    from hybridrl.workers.policy import PolicyWeights
    from hybridrl.workers.weight_sync import WeightSync

    if dist.is_initialized():
        activate(build_layout(world_size(), fsdp_size))
    engine = TrainEngine(torch.device("cpu"), "actor", forward=None)
    model = engine.place(tiny_qwen2(VOCAB, hidden_size=32, intermediate_size=64, seed=3), remove_padding=False)
    engine.build_optimizer(OptimConfig(lr=LR), total_steps=4, grad_clip=CLIP)
    if load:
        engine.load(load)
    out = {"loss": [], "grad_norm": []}
    for step in steps:
        ids, mask = _batch(step)
        ids, mask = ids.chunk(fsdp.dp_size())[fsdp.dp_rank()], mask.chunk(fsdp.dp_size())[fsdp.dp_rank()]
        normalizer = fsdp.dp_normalizer(float(mask.sum()))
        loss = torch.zeros((), dtype=torch.float64)
        for a, b in MICROS if fsdp.dp_size() > 1 else ((0, 4), (4, 5), (5, 12)):
            part = _nll(model, ids[a:b], mask[a:b]) / normalizer
            part.backward()
            loss += float(part.detach())
        grad_norm, stepped = engine.step()
        assert stepped
        if dist.is_initialized():
            dist.all_reduce(loss)
            loss /= world_size()
        out["loss"].append(float(loss))
        out["grad_norm"].append(float(grad_norm))
    if save:
        engine.save(save)
    out["weights"] = {n: t.clone() for n, t in fsdp.full_named_parameters(model)}
    out["sharded"] = fsdp.is_sharded(model)
    out["replicated"] = replicate.is_replicated(model)
    out["dtensors"] = sum(type(p).__name__ == "DTensor" for p in model.parameters())
    sync = WeightSync(engine, PolicyWeights(ModelConfig(path="unused")))
    out["start_weights_none"] = sync.start_weights() is None  # the rollout engine is built over the policy
    mine = {p.data_ptr() for p in model.parameters()}
    out["push_aliases"] = all(t.data_ptr() in mine for _, t in sync.named_weights())  # a push: no gather, no copy
    return out


def tp_pieces(pool, rank) -> tuple[int, bool]:
    """A replicated model's tensor-parallel rollout pieces (rank r keeps slice r of 2): (bytes
    received, whether every piece is the slice of the full weight)."""
    from hybridrl.config.layout import build_layout
    from hybridrl.distributed import fsdp
    from hybridrl.distributed.layout import activate
    from hybridrl.distributed.reshard import Reshard
    from hybridrl.models import tp_shards
    from hybridrl.models.tiny import tiny_qwen2

    activate(build_layout(2, 1, tp=2))
    model = fsdp.place(tiny_qwen2(VOCAB, hidden_size=32, intermediate_size=64, seed=3), torch.device("cpu"))
    full = dict(model.named_parameters())
    reshard = Reshard(model, model.config, rank % 2, 2)
    same = all(
        torch.equal(piece, tp_shards.shard(name, full[name].detach(), model.config, rank % 2, 2))
        for name, piece in reshard.pieces()
    )
    return reshard.bytes_received, same


def averaged(pool, rank, bucket_bytes: int) -> dict:
    """Hand-set gradients averaged over 2 ranks in buckets of `bucket_bytes`: rank r's gradient is
    (r + 1) x a ramp; `only_rank0` has one on rank 0 only, `none` on no rank."""
    import torch.distributed as dist

    from hybridrl.config.layout import build_layout
    from hybridrl.distributed import fsdp, replicate
    from hybridrl.distributed.layout import activate

    activate(build_layout(dist.get_world_size(), 1))
    model = fsdp.place(
        torch.nn.ParameterDict({k: torch.nn.Parameter(torch.zeros(n)) for k, n in _SIZES.items()}), torch.device("cpu")
    )
    for k, n in _SIZES.items():
        if k == "none" or (k == "only_rank0" and rank != 0):
            continue
        model[k].grad = (rank + 1) * torch.arange(n, dtype=torch.float32)
    replicate.average_gradients(model, bucket_bytes=bucket_bytes)
    return {k: None if p.grad is None else p.grad.clone() for k, p in model.items()}


_SIZES = {"a": 5, "only_rank0": 3, "b": 300, "none": 4, "c": 7}


def test_gradients_are_averaged_in_buckets_and_missing_ones_count_as_zero(backend):
    for bucket_bytes in (16, 64, 2**20):  # a gradient larger than a bucket; several per bucket; one bucket
        for grads in backend.run_on_hosts(averaged, bucket_bytes):
            for k, n in _SIZES.items():
                ramp = torch.arange(n, dtype=torch.float32)
                expected = {"none": None, "only_rank0": ramp / 2}.get(k, 1.5 * ramp)
                if expected is None:
                    assert grads[k] is None, k
                else:
                    torch.testing.assert_close(grads[k], expected, rtol=0, atol=0, msg=f"{k} at {bucket_bytes}")


@pytest.fixture(scope="module")
def backend(ray_session, tiny_model_dir, arith_data):
    from ray import cloudpickle

    from hybridrl.distributed.ray_backend import RayBackend

    cloudpickle.register_pickle_by_value(__import__(__name__))  # the functions travel by value
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 2, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir}, "actor": {"ppo_mini_batch_size": 2}},
            "trainer": {"device": "cpu", "n_gpus_per_node": 2, "logger": ["jsonl"]},
        }
    )
    b = RayBackend(cfg, plan_batches(cfg), {"idle": Idle})
    yield b
    b.shutdown()


def _close(a: dict, b: dict, steps=slice(None)):
    assert a["loss"] == pytest.approx(b["loss"][steps], rel=1e-5)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"][steps], rel=1e-5)
    for name, w in a["weights"].items():
        # Adam divides by sqrt(v): float noise of a gradient near 0 moves a weight by up to ~1e-6
        # here (LR 1e-2), where a missing or doubled gradient would move it by ~LR
        torch.testing.assert_close(w, b["weights"][name], rtol=1e-5, atol=1e-5, msg=name)


def test_replicated_steps_equal_fsdp_and_one_process_with_no_fsdp_and_no_gather(backend):
    replicated = backend.run_on_hosts(train, 1, (0, 1))
    sharded = backend.run_on_hosts(train, -1, (0, 1))
    one = train(None, 0, -1, (0, 1))
    assert one["grad_norm"][0] > CLIP  # the clip is exercised
    assert one["weights"].keys() == replicated[0]["weights"].keys()
    for r, s in zip(replicated, sharded, strict=True):
        _close(r, s)
        _close(r, one)
        # (b) a whole model on each rank, not FSDP-wrapped; the rollout aliases it, no gather
        assert (r["replicated"], r["sharded"], r["dtensors"]) == (True, False, 0)
        assert r["start_weights_none"] and r["push_aliases"]
        assert (s["replicated"], s["sharded"], s["start_weights_none"], s["push_aliases"]) == (False, True, False, False)
        assert s["dtensors"] > 0
    for name, w in replicated[0]["weights"].items():  # the replicas stay identical
        assert torch.equal(w, replicated[1]["weights"][name]), name


def test_a_tensor_parallel_rollout_cuts_its_slices_from_the_replica_without_communication(backend):
    assert backend.run_on_hosts(tp_pieces) == [(0, True), (0, True)]


@pytest.mark.parametrize("saved_by, resumed_by", [(1, 1), (1, -1), (-1, 1)])
def test_checkpoint_resumes_the_next_step_exactly_sharded_or_not(backend, tmp_path, saved_by, resumed_by):
    whole = backend.run_on_hosts(train, resumed_by, (0, 1))
    backend.run_on_hosts(train, saved_by, (0,), None, str(tmp_path / "ckpt"))
    resumed = backend.run_on_hosts(train, resumed_by, (1,), str(tmp_path / "ckpt"))
    for r, w in zip(resumed, whole, strict=True):
        _close(r, w, slice(1, 2))


def test_a_replicated_checkpoint_loads_into_one_process(backend, tmp_path):
    whole = backend.run_on_hosts(train, 1, (0, 1))
    backend.run_on_hosts(train, 1, (0,), None, str(tmp_path / "ckpt"))
    _close(train(None, 0, -1, (1,), str(tmp_path / "ckpt")), whole[0], slice(1, 2))
