"""Save/load time of a sharded checkpoint (model + AdamW state) with DCP's default reader and
planner (unpickles `.metadata`, loads param_groups with weights_only off) against
hybridrl's allow-listed ones (hybridrl/distributed/checkpoint.py). CPU, one process.

    python benchmarks/lab/checkpoint_safe_load.py            # tiny and ~100M-parameter Qwen2 models
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridrl.distributed import checkpoint as dckpt

SHAPES = {
    "tiny": dict(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    "100M": dict(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=10,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
}


def build(shape: str):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[shape], tie_word_embeddings=False))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return model, opt, sched


def default_load(model, opt, path: Path) -> None:
    """What `dcp.load` does without hybridrl's reader and planner."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(get_model_state_dict(model), checkpoint_id=str(path / "model"), no_dist=True)
        dcp.load(get_optimizer_state_dict(model, opt), checkpoint_id=str(path / "optim"), no_dist=True)


def safe_load(model, opt, path: Path) -> None:
    dckpt._load(get_model_state_dict(model), path / "model")
    dckpt._load(get_optimizer_state_dict(model, opt), path / "optim")


def main(repeats: int = 3) -> None:
    for shape in sys.argv[1:] or list(SHAPES):
        model, opt, sched = build(shape)
        n = sum(p.numel() for p in model.parameters())
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "actor"
            saves, loads = [], {"default": [], "safe": []}
            for _ in range(repeats):
                t = time.perf_counter()
                dckpt.save_model(model, path)
                dckpt.save_optimizer(model, opt, sched, path)
                saves.append(time.perf_counter() - t)
                for name, fn in (("default", default_load), ("safe", safe_load)):
                    t = time.perf_counter()
                    fn(model, opt, path)
                    loads[name].append(time.perf_counter() - t)
        med = statistics.median
        print(
            f"{shape} ({n / 1e6:.1f}M params): save {med(saves):.3f} s | load default {med(loads['default']):.3f} s | "
            f"load safe {med(loads['safe']):.3f} s (median of {repeats})",
            flush=True,
        )


if __name__ == "__main__":
    main()
