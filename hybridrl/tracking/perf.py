"""Model FLOPs and MFU: how much of the device's peak the update achieves.

Counted FLOPs are the useful ones, the same for the packed and the padded path:
  dense   2 * N * tokens           N = parameters of the transformer blocks (+ final norm),
                                   i.e. without the input embedding (a lookup) and the LM head
  head    2 * V * H * targets      the LM head on the positions that predict response tokens
  attn    2 * layers * d_attn * sum_i L_i^2    causal QK^T and PV over each sequence's length
times 3 for forward + backward (weights and activations), 1 for a forward pass, and 2 for
LoRA's backward (activation gradients only; the adapters' own FLOPs are negligible). Padding
is never counted, so MFU falls when a path computes padding. MFU = FLOPs / time / peak, with
the peak dense bf16 FLOP/s of the device from `PEAK_BF16_FLOPS`.
"""

from __future__ import annotations

import torch

# Dense bf16 tensor-core peak (no sparsity), from the vendors' data sheets.
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def device_peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a CUDA device in the table; None on CPU or an unknown GPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


def model_shape(model) -> dict[str, int]:
    """Sizes the FLOP count needs, read from a HF model (or a peft/value wrapper around one)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    embed = base.get_input_embeddings()
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    skip = {id(embed.weight)} | ({id(head.weight)} if head is not None else set())
    dense = sum(p.numel() for p in base.parameters() if id(p) not in skip)
    n_experts, top_k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0) or 0
    if n_experts and top_k:  # a mixture of experts: a token runs k of the E experts of each sparse layer
        experts = sum(p.numel() for name, p in base.named_parameters() if ".experts." in name)
        dense -= int(experts * (1 - top_k / n_experts))
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return {
        "dense": dense,
        "vocab": cfg.vocab_size,
        "hidden": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "d_attn": heads * head_dim,
    }


def pass_flops(
    shape: dict[str, int], seq_lens: torch.Tensor, targets: int, *, lm_head: bool = True, shared_tokens: int = 0
) -> float:
    """Forward FLOPs of one pass over sequences of `seq_lens` tokens with `targets` scored
    positions; `shared_tokens` of them repeat a prompt computed once (models/packing.py)."""
    lens = seq_lens.double()
    flops = 2.0 * shape["dense"] * (float(lens.sum()) - shared_tokens)
    flops += 2.0 * shape["layers"] * shape["d_attn"] * float((lens**2).sum())
    if lm_head:
        flops += 2.0 * shape["vocab"] * shape["hidden"] * targets
    return flops


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    return None if not peak or seconds <= 0 else flops / seconds / peak


def max_memory_allocated_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def update_metrics(
    model,
    seq_lens: torch.Tensor,
    targets: int,
    passes: float,
    seconds: float,
    device: torch.device,
    role: str,
    shared_tokens: int = 0,
) -> dict[str, float]:
    """`perf/mfu/<role>` (`passes` x the forward FLOPs over `seconds`) and
    `perf/max_memory_allocated_gb`, each only where the device reports it."""
    out = {}
    flops = pass_flops(model_shape(model), seq_lens, targets, shared_tokens=shared_tokens)
    value = mfu(passes * flops, seconds, device_peak_flops(device))
    if value is not None:
        out[f"perf/mfu/{role}"] = value
    mem = max_memory_allocated_gb(device)
    if mem is not None:
        out["perf/max_memory_allocated_gb"] = mem
    return out
