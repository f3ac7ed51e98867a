"""The worker processes of test_native_tp.py (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import gc
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spmd_helpers import leave
from test_native_engine import GREEDY, TOK, engine_for, hf_model, prompts

from hybridrl.data import keys as K
from hybridrl.models import tp_shards
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.native.engine import NativeRolloutEngine

SAMPLED = SamplingParams(n=2, temperature=0.8, max_new_tokens=10)
TOP = SamplingParams(n=2, temperature=1.0, top_k=5, top_p=0.9, max_new_tokens=8)
CASES = {"greedy": GREEDY, "sampled": SAMPLED, "top_k_top_p": TOP}
FAMILIES = ("qwen2", "llama-bias", "qwen3", "qwen2-tied", "qwen2-padded")


def generate_all(engine) -> dict:
    out = {}
    for name, sampling in CASES.items():
        # a different global generator on every rank: the replica must sample with its first rank's seeds
        torch.manual_seed(1234 + 7 * (dist.get_rank() if dist.is_initialized() else 0))
        b = engine.generate(prompts(), sampling)
        out[name] = {k: b[k] for k in (K.RESPONSES, K.RESPONSE_MASK, K.ROLLOUT_LOG_PROBS)}
    return out


def engine_kwargs(device: str) -> dict:
    """CPU: the CPU tests' tiny cache blocks; CUDA: float32 with CUDA graphs (the default there)."""
    return {} if device == "cpu" else dict(device=device, dtype=torch.float32, block_size=16, max_num_seqs=8)


def _rank_main(rank: int, world: int, port: int, families: tuple, result_dir: str, device: str) -> None:
    torch.set_num_threads(1)
    backend = "gloo" if device == "cpu" else "nccl"
    if device != "cpu":
        device = f"cuda:{rank}"
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from hybridrl.rollout.native.tp import TensorParallel

    tp = TensorParallel.of(dist.new_group(list(range(world))))
    results = {}
    for family in families:
        model = hf_model(family).to(device)
        engine = engine_for(model, tp=tp, **engine_kwargs(device))
        results[family] = generate_all(engine)
        results[family]["graphs"] = len(engine.runner.graphs)
        # pre-sliced pieces (the resharder's path) give the same shard as slicing full tensors
        fresh = NativeRolloutEngine(model.config, TOK, max_model_len=64, tp=tp, **{"block_size": 4, **engine_kwargs(device)})
        pieces = ((n, tp_shards.shard(n, p, model.config, tp.rank, tp.size).clone()) for n, p in model.named_parameters())
        fresh.load_weights(pieces, sharded=True)
        same = all(torch.equal(a, b) for a, b in zip(fresh.model.state_dict().values(), engine.model.state_dict().values()))
        results[family]["sharded_load_equal"] = same
        results[family]["kv_heads"] = engine.model.n_kv_heads
    torch.save(results, os.path.join(result_dir, f"rank{rank}.pt"))
    # CUDA graphs that captured NCCL all-reduces must go before the communicator: destroying the
    # process group under live graphs hangs (seen on 2 H200s, torch 2.11)
    del engine, fresh
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    leave()


def run_tp(world: int, families: tuple, tmp_path, device: str = "cpu") -> list[dict]:
    """`world` processes (gloo on CPU, NCCL over GPUs 0..world-1 with device="cuda") each run the
    families' generations as one TP group; each rank's results."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_rank_main, args=(world, port, families, str(tmp_path), device), nprocs=world, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]
