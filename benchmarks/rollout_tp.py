"""Tensor-parallel rollout vs data-parallel rollout on one node: the native engine at every TP size
that fits the world and the model, the same prompts in total, random weights, EOS ignored.

Command (N GPUs):  torchrun --nproc_per_node N benchmarks/rollout_tp.py --out $OUT
CPU smoke test:    torchrun --nproc_per_node 2 benchmarks/rollout_tp.py --tiny --out /tmp/rollout_tp

For each model (Qwen2.5-1.5B and 7B shapes) and each tp dividing the world (and the model's heads),
the world's ranks form world / tp replicas of tp consecutive ranks (as `rollout.tensor_model_parallel_size`
lays them out); `--prompts` prompts of `--prompt-len` random tokens are split over the replicas
and each generates `--new-tokens` tokens per prompt (sampling at temperature 1).
- tokens/s: all new tokens / the slowest rank's wall time of the generate call (after a warm-up
  call that captures the CUDA graphs);
- decode ms/step: the engine's own per-step time, mean over ranks;
- weights GB / peak GB per GPU: the rank's weight shard, and torch.cuda.max_memory_allocated
  during the timed call (weights + KV cache + workspace; the cache takes gpu_memory_utilization
  of what is free).
Prints a table on rank 0 and writes rollout_tp.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import leave_process_group  # noqa: E402
from rollout import COMMON, MODELS, _Tok, make_prompts  # noqa: E402

from hybridrl.data import keys as K  # noqa: E402
from hybridrl.models.tp_shards import check_tp  # noqa: E402
from hybridrl.rollout import SamplingParams  # noqa: E402
from hybridrl.rollout.native.engine import NativeRolloutEngine  # noqa: E402
from hybridrl.rollout.native.tp import TensorParallel  # noqa: E402

SHAPES = {
    "Qwen2.5-1.5B": MODELS["Qwen2.5-1.5B"],
    "Qwen2.5-7B": dict(
        COMMON,
        vocab_size=152064,
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        tie_word_embeddings=False,
    ),
    "tiny": MODELS["tiny"],
}


def hf_config(name: str):
    from transformers import Qwen2Config

    return Qwen2Config(**SHAPES[name])


def replica_group(world: int, tp: int):
    """This rank's group of tp consecutive ranks (every rank creates every group, in order)."""
    mine = None
    for first in range(0, world, tp):
        g = dist.new_group(list(range(first, first + tp)))
        if first <= dist.get_rank() < first + tp:
            mine = g
    return mine


def run(name: str, tp: int, args, device) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = hf_config(name)
    group = replica_group(world, tp) if tp > 1 else None
    engine = NativeRolloutEngine(
        cfg,
        _Tok(cfg.eos_token_id, cfg.pad_token_id),
        device=device,
        max_model_len=args.prompt_len + args.new_tokens,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        ignore_eos=True,
        tp=TensorParallel.of(group) if group is not None else None,
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for p in engine.model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
            else:  # norm weights
                p.fill_(1.0)
    replicas = world // tp
    prompts = make_prompts(args.prompts, args.prompt_len, cfg.vocab_size).chunk(replicas)[rank // tp]
    engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=4))  # warm-up: graphs
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    dist.barrier()
    t = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=args.new_tokens))
    sync(device)
    wall = torch.tensor(
        [time.perf_counter() - t, engine.last_metrics["rollout/decode_ms_per_step"]], dtype=torch.float64, device=device
    )
    assert int(out[K.RESPONSE_MASK].sum()) == len(prompts) * args.new_tokens
    slowest = wall.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    dist.all_reduce(wall)
    weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else float("nan")
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(
        model=name,
        tp=tp,
        replicas=replicas,
        tokens_per_s=args.prompts * args.new_tokens / float(slowest[0]),
        decode_ms=float(wall[1]) / world,
        weights_gb=weights / 1e9,
        peak_gb=peak / 1e9,
    )


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke test (gloo) with a tiny config")
    ap.add_argument("--out", default=".")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--prompts", type=int, default=None, help="prompts in total (split over the replicas)")
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    args = ap.parse_args()
    cuda = not args.tiny
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    models = args.models or (["tiny"] if args.tiny else ["Qwen2.5-1.5B", "Qwen2.5-7B"])
    args.prompts = args.prompts or (8 if args.tiny else 256)
    args.prompt_len = args.prompt_len or (16 if args.tiny else 256)
    args.new_tokens = args.new_tokens or (16 if args.tiny else 512)
    world = dist.get_world_size()
    rows = []
    for name in models:
        cfg = SimpleNamespace(**SHAPES[name])
        for tp in [t for t in range(1, world + 1) if world % t == 0 and check_tp(cfg, t) is None]:
            row = run(name, tp, args, device)
            rows.append(row)
            if dist.get_rank() == 0:
                print(row, flush=True)
    if dist.get_rank() == 0:
        head = "| model | replicas x tp | tok/s | decode ms/step | weights GB/GPU | peak GB/GPU |\n" + "| --- " * 6 + "|"
        table = [
            f"| {r['model']} | {r['replicas']} x {r['tp']} | {r['tokens_per_s']:.0f} | {r['decode_ms']:.2f} | "
            f"{r['weights_gb']:.2f} | {r['peak_gb']:.2f} |"
            for r in rows
        ]
        print("\n".join([head, *table]))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = dict(world=world, device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__)
        (out / "rollout_tp.json").write_text(json.dumps(dict(meta, args=vars(args), rows=rows), indent=1))
    leave_process_group()


if __name__ == "__main__":
    main()
