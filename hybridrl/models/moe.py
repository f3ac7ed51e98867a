"""Mixture-of-experts math shared by the trainer's blocks (moe_block.py) and the native engine's
decoder (moe_decoder.py): which layers are sparse, the top-k softmax router, the experts' SwiGLU
as grouped GEMMs, and the load-balancing loss.

The Qwen3-MoE / Qwen2-MoE layout, as transformers 5 holds it in memory (its checkpoints on disk
keep one `mlp.experts.{e}.{gate,up,down}_proj.weight` per expert; transformers fuses them on
load and splits them again on save):
- `mlp.gate.weight` (E, H): the router;
- `mlp.experts.gate_up_proj` (E, 2I, H): each expert's gate rows then its up rows;
- `mlp.experts.down_proj` (E, H, I);
- Qwen2-MoE only: a shared expert (`mlp.shared_expert.{gate,up,down}_proj`, intermediate size
  `shared_expert_intermediate_size`) added to every token, scaled by sigmoid(`mlp.shared_expert_gate`).

Routing (both families): p = softmax(x W_gate^T) in float32, the k largest, renormalized to sum
to 1 when `norm_topk_prob` (`router_probs`, `select_experts`, `route_weights`; replaying a
recorded routing swaps only the choice of the k). A token's output is sum_j p_j SwiGLU_{e_j}(x).

Expert compute (`expert_forward`): the (token, slot) assignments are sorted by expert, each
expert's rows run through its SwiGLU as one GEMM of a grouped GEMM, and the rows go back to
their tokens. Two paths, one function: `torch._grouped_mm` (one kernel for all experts; fixed
shapes and device-side offsets, so a CUDA graph can capture it: the engine's decode step) and a
loop over the experts (any dtype, float64 included: the CPU default and the reference).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# HF architecture -> the attention family of `hybridrl.models.llama` its layers use
MOE_ARCHITECTURES = {"Qwen3MoeForCausalLM": "qwen3", "Qwen2MoeForCausalLM": "qwen2"}
MOE_MODEL_TYPES = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}
IMPLS = ("auto", "grouped", "loop", "dense")
# torch >= 2.10 names it F.grouped_mm; torch._grouped_mm before (None: the loop only)
_grouped_mm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def _accum(dtype: torch.dtype) -> torch.dtype:
    """Sums and softmaxes in float32, float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def architecture(config) -> str:
    """The config's HF architecture; a config built in memory has none: its model_type names it."""
    arch = (getattr(config, "architectures", None) or [None])[0]
    return arch or MOE_MODEL_TYPES.get(getattr(config, "model_type", None), "?")


def is_moe(config) -> bool:
    """The HF config describes one of the MoE architectures here."""
    return architecture(config) in MOE_ARCHITECTURES


def sparse_layers(config) -> list[int]:
    """Indices of the decoder layers whose MLP is a mixture of experts (HF's rule: every
    `decoder_sparse_step`-th layer, except those in `mlp_only_layers`, when num_experts > 0)."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    if getattr(config, "num_experts", 0) <= 0:
        return []
    return [i for i in range(config.num_hidden_layers) if i not in dense and (i + 1) % step == 0]


def router_probs(logits: torch.Tensor) -> torch.Tensor:
    """softmax of the router logits (T, E) in float32 (as HF's routers), float64 for float64 logits
    (the exactness tests)."""
    return torch.softmax(logits, dim=-1, dtype=_accum(logits.dtype))


def select_experts(probs: torch.Tensor, top_k: int, replay: torch.Tensor | None = None) -> torch.Tensor:
    """Expert ids (T, k) int64: the k most probable experts of each token (probs (T, E)), or the
    ids of `replay` (T, k) (router replay) where its row's first id is >= 0. No gradient flows
    through ids."""
    ids = probs.detach().topk(top_k, dim=-1).indices
    if replay is not None:
        ids = torch.where((replay[:, :1] >= 0).expand_as(ids), replay.long(), ids)
    return ids


def route_weights(probs: torch.Tensor, ids: torch.Tensor, norm_topk_prob: bool) -> torch.Tensor:
    """Weights (T, k) float32: the probabilities of experts `ids`, renormalized to sum to 1 with
    `norm_topk_prob`. Differentiable in the probabilities whatever chose the ids (the router
    learns under replay too)."""
    top = probs.gather(1, ids)
    return top / top.sum(-1, keepdim=True) if norm_topk_prob else top


def pick_impl(impl: str, x: torch.Tensor) -> str:
    """`auto`: on CUDA grouped GEMMs in 16-bit on sm80+ (the kernels grouped_mm has), else every
    expert over every token, weighted 0 where not routed (`dense`: no host sync either, so a CUDA
    graph can still capture it; the float32 engines of the tests); the loop on the CPU."""
    if impl not in IMPLS:
        raise ValueError(f"expert impl {impl!r}: choose one of {', '.join(IMPLS)}")
    if impl != "auto":
        return impl
    if not x.is_cuda:
        return "loop"
    kernel = _grouped_mm is not None and torch.cuda.get_device_capability(x.device) >= (8, 0)
    return "grouped" if kernel and x.dtype in (torch.bfloat16, torch.float16) else "dense"


def grouped_swiglu(xs: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, impl: str) -> torch.Tensor:
    """SwiGLU of rows sorted by expert: xs (M, H), the first counts[e] rows of what is left for
    expert e (counts (E,)), gate_up (E, 2I, H), down (E, H, I) -> (M, H); rows past sum(counts)
    (assignments to experts held elsewhere) are 0. `impl`: grouped (no host sync) or loop."""
    if impl == "grouped":
        offs = counts.cumsum(0).to(torch.int32)  # (E,) end of each expert's rows, on the device
        gu = _grouped_mm(xs, gate_up.transpose(-2, -1), offs=offs)  # (M, 2I)
        gate, up = gu.chunk(2, dim=-1)
        out = _grouped_mm(F.silu(gate) * up, down.transpose(-2, -1), offs=offs)  # (M, H)
        # rows past the last offset are not written by the kernel: masked_fill replaces whatever is there
        past = torch.arange(xs.shape[0], device=xs.device) >= offs[-1]
        return out.masked_fill(past[:, None], 0)
    parts, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n:
            rows = xs[start : start + n]  # (n, H)
            gate, up = F.linear(rows, gate_up[e]).chunk(2, dim=-1)
            parts.append(F.linear(F.silu(gate) * up, down[e]))
            start += n
    parts.append(xs.new_zeros(xs.shape[0] - start, down.shape[1]))
    return torch.cat(parts)


def sort_by_expert(ids: torch.Tensor, first: int, n_local: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Assignments (T, k) -> (order (T*k,): the flat assignments sorted by local expert, those of
    experts outside [first, first + n_local) last; counts (n_local,) per local expert; inside (T*k,)).
    Fixed shapes and no host sync (CUDA-graph capturable)."""
    local = ids.reshape(-1) - first
    inside = (local >= 0) & (local < n_local)
    key = torch.where(inside, local, n_local)
    order = key.argsort(stable=True)
    counts = torch.zeros(n_local + 1, dtype=torch.long, device=ids.device).scatter_add_(0, key, torch.ones_like(key))
    return order, counts[:n_local], inside


def expert_forward(
    x: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    *,
    first: int = 0,
    impl: str = "auto",
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """sum_j weights[t, j] SwiGLU_{ids[t, j]}(x[t]) over the experts held here: x (T, H), ids and
    weights (T, k), gate_up (E_l, 2I, H) and down (E_l, H, I) of experts [first, first + E_l),
    all three in one dtype -> (T, H) in `out_dtype` (default x's), the weighted sum in float32.
    Assignments to other experts add nothing (the engine's TP ranks each hold some experts and
    all-reduce the partial sums)."""
    T, k = ids.shape
    impl = pick_impl(impl, x)
    if impl == "dense":
        return _dense(x, ids, weights, gate_up, down, first).to(out_dtype or x.dtype)
    order, counts, inside = sort_by_expert(ids, first, gate_up.shape[0])
    # repeat_interleave then a permutation: the backward sums each token's k rows without atomics
    xs = x.repeat_interleave(k, dim=0)[order]  # (T*k, H), sorted by expert
    ys = grouped_swiglu(xs, counts, gate_up, down, impl)  # (T*k, H)
    y = torch.empty_like(ys).index_copy(0, order, ys).view(T, k, -1)  # back in (token, slot) order
    acc = _accum(y.dtype)
    w = weights.to(acc) * inside.view(T, k)  # (T, k)
    return (y.to(acc) * w[..., None]).sum(1).to(out_dtype or x.dtype)


def _dense(x, ids, weights, gate_up, down, first: int) -> torch.Tensor:
    """`expert_forward` as E GEMMs over all T tokens, each expert's output weighted by the token's
    weight for it (0 when not routed there): E / k times the FLOPs, fixed shapes."""
    acc = _accum(x.dtype)
    out = torch.zeros(x.shape[0], down.shape[1], dtype=acc, device=x.device)
    for e in range(gate_up.shape[0]):
        w = (weights.to(acc) * (ids == first + e)).sum(-1)  # (T,)
        gate, up = F.linear(x, gate_up[e]).chunk(2, dim=-1)
        out += w[:, None] * F.linear(F.silu(gate) * up, down[e]).to(acc)
    return out


def load_balancing_loss(probs: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The Switch Transformer auxiliary loss as Qwen's HF models compute it for one layer
    (`load_balancing_loss_func`, Fedus et al. 2021, eqs. 4-6): E * sum_e f_e P_e, f_e the
    assignments to expert e per token (summing to k), P_e its mean router probability. k when
    the load is balanced. probs (T, E) float32, ids (T, k); `mask` (T,) counts real tokens only."""
    T, E = probs.shape
    w = torch.ones(T, device=probs.device) if mask is None else mask.float()
    n = w.sum().clamp(min=1)
    counts = torch.zeros(E, device=probs.device).scatter_add_(0, ids.reshape(-1), w.repeat_interleave(ids.shape[1]))
    return E * ((counts / n) * ((probs * w[:, None]).sum(0) / n)).sum()


def expert_counts(ids: torch.Tensor, n_experts: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Assignments per expert (E,) float32 (of the real tokens under `mask` (T,))."""
    w = torch.ones(ids.shape[0], device=ids.device) if mask is None else mask.float()
    return torch.zeros(n_experts, device=ids.device).scatter_add_(0, ids.reshape(-1), w.repeat_interleave(ids.shape[1]))
