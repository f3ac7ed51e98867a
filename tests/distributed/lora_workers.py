"""Worker processes of test_lora_fsdp.py (a module of its own: spawned processes import it by name)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from spmd_helpers import leave
from tiny_models import tiny_qwen2

from hybridrl.models import lora
from hybridrl.models.packing import enable_packing, pack, packed_log_probs

VOCAB = 37


def policy():
    """A tiny Qwen2 with LoRA adapters whose B is non-zero (so the merged weights differ from the base)."""
    model = lora.apply_lora(tiny_qwen2(VOCAB, attn="sdpa"), 4, 8, ["q_proj", "v_proj", "up_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    enable_packing(model, "sdpa", torch.device("cpu"))
    return model


def batch(rows: slice = slice(None)):
    g = torch.Generator().manual_seed(3)
    b, p, r = 6, 5, 6
    prompts = torch.randint(2, VOCAB, (b, p), generator=g)
    responses = torch.randint(2, VOCAB, (b, r), generator=g)
    rlen = torch.randint(1, r + 1, (b,), generator=g)
    response_mask = (torch.arange(r)[None] < rlen[:, None]).long()
    return prompts[rows], torch.ones_like(prompts)[rows], (responses * response_mask)[rows], response_mask[rows]


def loss_of(model, seqs, normalizer):
    from hybridrl.distributed.fsdp import run_as_forward  # the workers' path (gathers the root's weights)

    logp, _, _ = run_as_forward(model, packed_log_probs, pack(*seqs))
    return -(logp * seqs[3]).sum() / normalizer


def reference():
    """One process, the whole batch: the adapters' gradients and the merged weights."""
    model = policy()
    seqs = batch()
    loss_of(model, seqs, seqs[3].sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, dict(lora.merged_named_parameters(model))


def rank_main(rank: int, world: int, port: int, out: str, ckpt: str) -> None:
    from hybridrl.distributed.fsdp import dp_normalizer, full_weights, place

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = place(policy(), torch.device("cpu"))
    per = 6 // world
    seqs = batch(slice(rank * per, (rank + 1) * per))  # each rank its shard of the rows
    loss_of(model, seqs, dp_normalizer(float(seqs[3].sum()))).backward()
    grads = {n: lora._full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    merged = dict(lora.merged_named_parameters(model))
    with full_weights(model):  # the hf engine's path: generate on the gathered peft module
        ids = model.generate(input_ids=batch()[0][:2], max_new_tokens=3, do_sample=False)
    lora.save_lora_checkpoint(model, __import__("pathlib").Path(ckpt), None)
    if rank == 0:
        torch.save({"grads": grads, "merged": merged, "generated": ids}, out)
    leave()
