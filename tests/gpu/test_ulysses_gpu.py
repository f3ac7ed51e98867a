"""Ulysses sequence parallelism on 2 GPUs (NCCL, the varlen packed attention, bf16 autocast): sp=2
gives one GPU's log-probs, entropy and loss, and its gradients to bf16 reduction order. Skipped
with fewer than 2 GPUs. Measured on 2 H200s (2026-11-23): log-probs and loss identical, largest
relative gradient difference 2.6e-3."""

import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))


def _model(dev):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from ulysses_workers import VOCAB

    from hybridrl.models.packing import enable_packing
    from hybridrl.models.tiny import tiny_qwen2_config

    torch.manual_seed(0)
    cfg = Qwen2Config(
        **tiny_qwen2_config(VOCAB, hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=2)
    )
    cfg._attn_implementation = "sdpa"
    m = Qwen2ForCausalLM(cfg).to(dev)
    assert enable_packing(m, "auto", torch.device(dev)) == "varlen"
    return m


def _run(m, group):
    from ulysses_workers import batch

    from hybridrl.models.packing import pack, packed_log_probs

    m.zero_grad()
    seqs = tuple(t.to(next(m.parameters()).device) for t in batch())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logp, ent, _ = packed_log_probs(m, pack(*seqs), with_entropy=True, sp_group=group)
    mask = seqs[3].float()
    w = torch.linspace(0.5, 1.5, mask.shape[1], device=mask.device)
    loss = -(logp.float() * mask * w).sum() - 0.1 * (ent.float() * mask).sum()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters()}
    return logp.detach().float(), ent.detach().float(), loss.detach(), grads


def _rank_main(rank: int, port: int, out: str) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    logp, ent, loss, grads = _run(_model(f"cuda:{rank}"), dist.new_group([0, 1]))
    for g in grads.values():  # each rank holds sp x its share
        dist.all_reduce(g)
        g /= 2
    if rank == 0:
        grads = {k: v.cpu() for k, v in grads.items()}
        torch.save({"logp": logp.cpu(), "ent": ent.cpu(), "loss": loss.cpu(), "grads": grads}, out)
    dist.barrier()
    dist.destroy_process_group()


def test_sp2_on_two_gpus_equals_one(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "sp.pt")
    mp.start_processes(_rank_main, args=(port, out), nprocs=2, start_method="spawn")
    got = torch.load(out, weights_only=True)
    logp, ent, loss, grads = _run(_model("cuda:0"), None)
    torch.testing.assert_close(got["logp"], logp.cpu(), rtol=0, atol=1e-3)
    torch.testing.assert_close(got["ent"], ent.cpu(), rtol=0, atol=1e-3)
    torch.testing.assert_close(got["loss"], loss.cpu(), rtol=1e-4, atol=0)
    for name, g in grads.items():
        rel = (got["grads"][name] - g.cpu()).norm() / g.norm().cpu()
        assert rel < 2e-2, (name, float(rel))
