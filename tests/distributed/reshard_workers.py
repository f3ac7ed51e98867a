"""Worker processes of test_reshard.py (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from spmd_helpers import leave
from tiny_models import tiny_qwen2

from hybridrl.models import tp_shards

VOCAB = 37  # divisible by neither 2 nor 4


def model(dtype=torch.float32, lora_rank: int = 0):
    m = tiny_qwen2(VOCAB, dtype=dtype, tie_word_embeddings=False)
    if lora_rank:
        from hybridrl.models import lora

        m = lora.apply_lora(m, lora_rank, 2 * lora_rank, ["q_proj", "o_proj", "down_proj"])
        with torch.no_grad():
            for name, p in m.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    return m


def rank_main(rank: int, world: int, port: int, tp: int, dtype: str, hsdp: bool, lora_rank: int, out: str) -> None:
    from hybridrl.distributed.fsdp import place
    from hybridrl.distributed.reshard import Reshard
    from hybridrl.models.lora import merged_named_parameters

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    m = model(getattr(torch, dtype), lora_rank)
    full = {k: v.clone() for k, v in merged_named_parameters(m)}
    mesh = None
    if hsdp:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    sharded = place(m, torch.device("cpu"), mesh=mesh)
    config = (sharded.get_base_model() if lora_rank else sharded).config
    rs = Reshard(sharded, config, rank % tp, tp)
    pieces = dict(rs.pieces())
    expect = {k: tp_shards.shard(k, v, config, rank % tp, tp) for k, v in full.items()}
    result = {
        "names_equal": pieces.keys() == expect.keys(),
        "mismatch": [k for k in expect if k in pieces and not torch.equal(pieces[k], expect[k])],
        "dtype_ok": all(p.dtype == expect[k].dtype for k, p in pieces.items()),
        "received": rs.bytes_received,
        "full": rs.full_gather_bytes,
    }
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        torch.save(gathered, out)
    leave()
