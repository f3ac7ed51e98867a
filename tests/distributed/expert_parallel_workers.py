"""Worker processes of test_expert_parallel.py (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from spmd_helpers import leave
from tiny_models import tiny_moe

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.distributed import checkpoint as dckpt
from hybridrl.distributed.expert_parallel import reduce_expert_gradients
from hybridrl.distributed.fsdp import clip_grad_norm, full_named_parameters
from hybridrl.workers import forward
from hybridrl.workers.engine import TrainEngine

VOCAB = 40


def batch(n=8, P=6, R=5, seed=0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    plen, rlen = torch.randint(2, P + 1, (n,), generator=g), torch.randint(1, R + 1, (n,), generator=g)
    return Batch(
        {
            K.PROMPTS: torch.randint(2, VOCAB, (n, P), generator=g),
            K.PROMPT_MASK: (torch.arange(P)[None] >= P - plen[:, None]).long(),
            K.RESPONSES: torch.randint(2, VOCAB, (n, R), generator=g),
            K.RESPONSE_MASK: (torch.arange(R)[None] < rlen[:, None]).float(),
            K.ADVANTAGES: torch.randn(n, R, generator=g),
        }
    )


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def rank_main(rank: int, world: int, port: int, out: str, ckpt: str, device: str = "cpu") -> None:
    """gloo on CPU, or NCCL over GPUs 0..world-1 with device="cuda" (tests/gpu/test_moe.py)."""
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "gloo" if device == "cpu" else "nccl"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    model = tiny_moe(VOCAB, num_experts=4)  # the same seed on every rank
    data = batch()
    mine = data.index(slice(rank * len(data) // world, (rank + 1) * len(data) // world))
    tokens = float(data[K.RESPONSE_MASK].sum())
    results = {}
    for ep in (1, 2):
        engine = TrainEngine(dev, "actor", forward.log_probs)
        engine.place(copy.deepcopy(model), remove_padding=True, share_prompts=False, train=True, expert_parallel=ep)
        log_prob, _, _ = engine.run(forward.pack_on_host(engine, mine, engine.device))
        # the policy-gradient surrogate, normalized for FSDP's average over ranks (fsdp.dp_normalizer)
        m = mine.to(dev)
        loss = -(log_prob * m[K.ADVANTAGES] * m[K.RESPONSE_MASK]).sum() * world / tokens
        loss.backward()
        reduce_expert_gradients(engine.model)
        norm = clip_grad_norm(list(engine.model.parameters()), float("inf"))
        total = loss.detach().clone()
        dist.all_reduce(total)
        results[ep] = {
            "loss": float(total) / world,
            "norm": float(norm),
            "grads": {n: _full(p.grad).float().cpu() for n, p in engine.model.named_parameters()},
            "weights": {n: t.cpu() for n, t in full_named_parameters(engine.model)},
            "moe": engine.moe.metrics(),
            "expert_shape": tuple(engine.model.model.layers[0].mlp.experts.gate_up_proj.to_local().shape) if ep > 1 else None,
        }
        if ep > 1:  # a sharded checkpoint of the split experts, and the HF export, load back
            dckpt.save_model(engine.model, ckpt, engine.model.config, None)
            fresh = TrainEngine(dev, "actor", forward.log_probs)
            fresh.place(tiny_moe(VOCAB, num_experts=4, seed=7), remove_padding=True, train=False, expert_parallel=ep)
            dckpt.load_model(fresh.model, ckpt)
            results["reloaded"] = {n: t.cpu() for n, t in full_named_parameters(fresh.model)}
            dckpt.save_hf(engine.model, f"{ckpt}/hf")
    if rank == 0:
        torch.save(results, out)
    leave()
