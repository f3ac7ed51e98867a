"""Which slice of each Hugging Face parameter a tensor-parallel rank holds (Llama / Qwen family).

The one source of truth shared by the TP rollout engine (which builds its shard of the model)
and the resharder (which sends each rank only the slices it needs). Megatron's split:

- column-parallel, split on dim 0 (outputs): `q_proj` by query heads, `k_proj`/`v_proj` by key/value
  heads, `gate_proj`/`up_proj` by the intermediate size (weights and biases);
- row-parallel, split on dim 1 (inputs): `o_proj` by query heads, `down_proj` by the intermediate
  size; their biases are whole on every rank and must be added once, after the all-reduce;
- vocabulary-parallel, split on dim 0: `embed_tokens` and `lm_head`, in blocks of
  ceil(V / tp) rows (the last rank's block may be shorter; the engine pads it);
- a mixture of experts' fused expert weights (`mlp.experts.gate_up_proj` (E, 2I, H) and
  `mlp.experts.down_proj` (E, H, I), models/moe.py) split on dim 0, by whole experts: E / tp
  consecutive experts per rank; Qwen2-MoE's shared expert splits as a dense MLP;
- everything else (the RMSNorm weights, Qwen3's q/k norms, the MoE router) is replicated.

With fewer key/value heads than TP ranks (GQA, e.g. 2 KV heads at TP=4), each KV head is
replicated on tp / n_kv consecutive ranks: rank r holds KV head r * n_kv // tp.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("embed_tokens", "lm_head")
EXPERTS = ("experts",)  # module of the fused expert weights (gate_up_proj, down_proj)


class Slice(NamedTuple):
    dim: int
    start: int
    stop: int


def _module(name: str) -> tuple[str, str]:
    """'model.layers.3.self_attn.q_proj.weight' -> ('q_proj', 'weight')."""
    parts = name.split(".")
    return (parts[-2] if len(parts) >= 2 else ""), parts[-1]


def _dims(config) -> tuple[int, int, int]:
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv, head_dim


def check_tp(config, tp: int) -> str | None:
    """Why this model cannot run at tensor-parallel size `tp`, naming a size that works; None if it can."""
    if tp < 1:
        return f"tensor_model_parallel_size must be >= 1, got {tp}"
    if tp == 1:
        return None
    heads, kv, _ = _dims(config)
    split = {"intermediate_size": config.intermediate_size}  # sizes each rank takes 1/tp of
    if getattr(config, "num_experts", 0):  # a mixture of experts (E / tp whole experts per rank)
        split = {"num_experts": config.num_experts}
        if getattr(config, "mlp_only_layers", None) or (getattr(config, "decoder_sparse_step", 1) or 1) > 1:
            split["intermediate_size"] = config.intermediate_size  # its dense layers
        if getattr(config, "shared_expert_intermediate_size", 0):
            split["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size

    def fits(t: int) -> bool:
        return heads % t == 0 and (kv % t == 0 or t % kv == 0) and all(v % t == 0 for v in split.values())

    ok = [t for t in range(1, heads + 1) if fits(t)]
    hint = f"; sizes that work for this model: {', '.join(map(str, ok))}"
    if heads % tp:
        return f"{heads} attention heads are not divisible by tensor_model_parallel_size={tp}{hint}"
    if kv % tp and tp % kv:
        return f"{kv} key/value heads and tensor_model_parallel_size={tp}: one must divide the other{hint}"
    for key, v in split.items():
        if v % tp:
            return f"{key} {v} is not divisible by tensor_model_parallel_size={tp}{hint}"
    return None


def tp_slice(name: str, shape: tuple[int, ...], config, tp_rank: int, tp_size: int) -> Slice | None:
    """The slice of parameter `name` (of full `shape`) that rank `tp_rank` of `tp_size` holds;
    None when the rank holds it whole (replicated)."""
    if tp_size == 1:
        return None
    module, kind = _module(name)
    heads, kv, head_dim = _dims(config)
    if module in EXPERTS:
        per = shape[0] // tp_size
        return Slice(0, tp_rank * per, (tp_rank + 1) * per)
    if module in VOCAB:
        block = -(-shape[0] // tp_size)
        return Slice(0, min(tp_rank * block, shape[0]), min((tp_rank + 1) * block, shape[0]))
    if module in ("k_proj", "v_proj"):
        if kv >= tp_size:
            per = kv // tp_size
            return Slice(0, tp_rank * per * head_dim, (tp_rank + 1) * per * head_dim)
        head = tp_rank * kv // tp_size
        return Slice(0, head * head_dim, (head + 1) * head_dim)
    if module in COLUMN:
        per = shape[0] // tp_size
        return Slice(0, tp_rank * per, (tp_rank + 1) * per)
    if module in ROW and kind == "weight":
        per = shape[1] // tp_size
        return Slice(1, tp_rank * per, (tp_rank + 1) * per)
    return None


def vocab_block(vocab_size: int, tp_size: int) -> int:
    """Rows of the embedding / LM head per rank (the padded block size)."""
    return -(-vocab_size // tp_size)


def shard(name: str, tensor: torch.Tensor, config, tp_rank: int, tp_size: int) -> torch.Tensor:
    """The rank's piece of a full tensor (a view; the tensor itself when replicated)."""
    s = tp_slice(name, tuple(tensor.shape), config, tp_rank, tp_size)
    return tensor if s is None else tensor.narrow(s.dim, s.start, s.stop - s.start)


def shard_bytes(name: str, shape: tuple[int, ...], itemsize: int, config, tp_rank: int, tp_size: int) -> int:
    """Bytes of the rank's piece of a parameter of full `shape`."""
    s = tp_slice(name, shape, config, tp_rank, tp_size)
    n = 1
    for d, size in enumerate(shape):
        n *= (s.stop - s.start) if s is not None and d == s.dim else size
    return n * itemsize
