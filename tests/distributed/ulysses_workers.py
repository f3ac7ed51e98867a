"""Worker processes of test_ulysses.py (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from spmd_helpers import leave
from tiny_models import tiny_qwen2

from hybridrl.models.packing import enable_packing, pack, packed_log_probs

VOCAB = 37


def model(kv_heads: int = 2):
    m = tiny_qwen2(VOCAB, dtype=torch.float64, attn="sdpa", num_key_value_heads=kv_heads)
    enable_packing(m, "sdpa", torch.device("cpu"))
    return m


def batch(seed: int = 1):
    """Left-padded prompts and right-padded responses of different lengths (a ragged packed row)."""
    g = torch.Generator().manual_seed(seed)
    b, p, r = 5, 6, 7
    prompts = torch.randint(2, VOCAB, (b, p), generator=g)
    responses = torch.randint(2, VOCAB, (b, r), generator=g)
    plen = torch.randint(1, p + 1, (b,), generator=g)
    rlen = torch.randint(1, r + 1, (b,), generator=g)
    prompt_mask = (torch.arange(p)[None] >= p - plen[:, None]).long()
    response_mask = (torch.arange(r)[None] < rlen[:, None]).long()
    return prompts * prompt_mask, prompt_mask, responses * response_mask, response_mask


def loss_and_grads(m, group=None):
    """Log-probs, entropy and the gradient of a loss that mixes both, in float64."""
    m.zero_grad()
    packed = pack(*batch())
    logp, ent, _ = packed_log_probs(m, packed, with_entropy=True, sp_group=group)
    mask = batch()[3].double()
    loss = -(logp * mask * torch.linspace(0.5, 1.5, mask.shape[1], dtype=torch.float64)).sum() - 0.1 * (ent * mask).sum()
    loss.backward()
    return logp.detach(), ent.detach(), loss.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def rank_main(rank: int, world: int, port: int, kv_heads: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))
    m = model(kv_heads)
    logp, ent, loss, grads = loss_and_grads(m, group)
    # every rank computed the whole loss; the parameter gradients are sp x each rank's share
    for g in grads.values():
        dist.all_reduce(g)
        g /= world
    if rank == 0:
        torch.save({"logp": logp, "ent": ent, "loss": loss, "grads": grads}, out)
    leave()
