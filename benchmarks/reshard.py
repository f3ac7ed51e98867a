"""Trainer -> TP-rollout weight switch: resharding (distributed/reshard.py) against a full gather.

Each rank holds the model FSDP2-sharded over all N ranks (the trainer's layout); the rollout is
replicas x tp. Timed, after warm-up, median of --repeats (CUDA events inside a barrier pair):
  reshard     every rank receives its TP pieces (one all-to-all per parameter in the shard group)
  full gather every rank gathers every whole parameter (`full_tensor()`, today's TP=1 path) and
              slices its piece locally
plus the bytes each rank receives. Random weights of a real architecture (shapes decide the cost).

    torchrun --nproc_per_node N benchmarks/reshard.py --out $OUT [--models Qwen2.5-0.5B Qwen2.5-7B] [--tp 2 4]
    torchrun --nproc_per_node 2 benchmarks/reshard.py --smoke --out /tmp/reshard     # CPU, gloo, tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import leave_process_group  # noqa: E402
from rollout import MODELS  # noqa: E402  (the benchmarks' model shapes)
from rollout_tp import SHAPES  # noqa: E402

CONFIGS = {**MODELS, **SHAPES}


def build(name: str, device: torch.device):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**CONFIGS[name])
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(cfg)


def timed(fn, device: torch.device, repeats: int) -> float:
    out = []
    for _ in range(repeats + 1):  # the first is warm-up
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU (gloo), tiny model")
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--tp", nargs="*", type=int, default=None, help="TP sizes (default: every divisor > 1 of N)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()

    from hybridrl.distributed.fsdp import place
    from hybridrl.distributed.reshard import Reshard
    from hybridrl.models import tp_shards

    cuda = torch.cuda.is_available() and not args.smoke
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    models = args.models or (["tiny"] if args.smoke else ["Qwen2.5-0.5B", "Qwen2.5-7B"])
    tps = args.tp or [t for t in range(2, world + 1) if world % t == 0]
    rows = []
    for name in models:
        model = place(build(name, device), device)
        config = model.config
        for tp in tps:
            if tp_shards.check_tp(config, tp):
                continue
            stats = {}

            def reshard():
                rs = Reshard(model, config, rank % tp, tp)
                for _ in rs.pieces():
                    pass
                stats["received"], stats["full"] = rs.bytes_received, rs.full_gather_bytes

            def full_gather():
                for n, p in model.named_parameters():
                    whole = p.detach().full_tensor()
                    tp_shards.shard(n, whole, config, rank % tp, tp).clone()
                    del whole

            t_reshard = timed(reshard, device, args.repeats)
            t_full = timed(full_gather, device, args.repeats)
            row = {
                "model": name,
                "world": world,
                "tp": tp,
                "reshard_ms": 1e3 * t_reshard,
                "full_gather_ms": 1e3 * t_full,
                "reshard_gb_per_rank": stats["received"] / 1e9,
                "full_gather_gb_per_rank": stats["full"] / 1e9,
                "device": torch.cuda.get_device_name() if cuda else "cpu",
            }
            rows.append(row)
        model = None  # free it before the next model
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0:
        print("| model | ranks | tp | reshard ms | full gather ms | GB received per rank (reshard / full) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in rows:
            print(
                f"| {r['model']} | {r['world']} | {r['tp']} | {r['reshard_ms']:.1f} | {r['full_gather_ms']:.1f} | "
                f"{r['reshard_gb_per_rank']:.3f} / {r['full_gather_gb_per_rank']:.3f} |"
            )
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "reshard.json").write_text(json.dumps(rows, indent=2) + "\n")
    leave_process_group()


if __name__ == "__main__":
    main()
