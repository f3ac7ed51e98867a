"""The native engine's decoder for the Qwen3-MoE / Qwen2-MoE architectures: `llama.DecoderLM`
with a mixture-of-experts feed-forward (`MoeMLP`) in its sparse layers (`moe.sparse_layers`).

Parameter names are those of transformers' in-memory model (fused experts: `mlp.gate.weight`,
`mlp.experts.gate_up_proj` (E, 2I, H), `mlp.experts.down_proj` (E, H, I), Qwen2-MoE's
`mlp.shared_expert.*` and `mlp.shared_expert_gate.weight`), so the trainer's weights load (or
alias) by name; `load_expert` also takes the per-expert names of checkpoints on disk
(`mlp.experts.{e}.gate_proj.weight`, ...).

The decode step stays one CUDA graph: routing is a top-k, the experts run as grouped GEMMs over
the (token, slot) assignments sorted on the device (`moe.expert_forward`), no shape depends on
the routing and nothing waits for the host. With `route_sink.buf` set (router replay R3), each
sparse layer writes the expert ids it used for every token into it: (tokens, sparse layers, k).

Tensor parallelism (`rollout/native/tp.py`) gives each rank E / tp whole experts (not a slice
of every expert's intermediate size): the rank computes the assignments to its experts, and
one all-reduce per layer sums the ranks' partial outputs (with the shared expert's, whose
intermediate size is split as a dense MLP's). The decode step reads every weight once either
way; whole experts keep each GEMM as wide as at TP=1 and the resharder moves them as plain
row blocks (`tp_shards`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybridrl.models import llama, moe


class RouteSink:
    """Where the sparse layers write the expert ids of a forward pass: `buf` (tokens, L, k) int16, or None."""

    def __init__(self):
        self.buf: torch.Tensor | None = None


class Router(nn.Module):
    def __init__(self, hidden: int, n_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, hidden))


class Experts(nn.Module):
    """Experts [first, first + n) of the layer (all of them at TP=1)."""

    def __init__(self, n: int, hidden: int, inter: int, first: int = 0):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(n, hidden, inter))
        self.first = first


class MoeMLP(nn.Module):
    def __init__(self, config, index: int, sink: RouteSink):
        super().__init__()
        h = config.hidden_size
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, bool(getattr(config, "norm_topk_prob", False))
        self.gate = Router(h, config.num_experts)
        self.experts = Experts(config.num_experts, h, config.moe_intermediate_size)
        shared = getattr(config, "shared_expert_intermediate_size", 0) or 0
        self.shared_expert = llama.MLP(config, shared) if shared else None
        self.shared_expert_gate = nn.Linear(h, 1, bias=False) if shared else None
        self.index, self.sink = index, sink  # index: among the sparse layers
        self.tp = None  # a TensorParallel group: the partial outputs are all-reduced
        self.impl = "auto"  # moe.IMPLS

    def fuse(self, on: bool = True) -> None:
        if self.shared_expert is not None:
            self.shared_expert.fuse(on)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, H)
        probs = moe.router_probs(F.linear(flat, self.gate.weight))  # (N, E) float32
        ids = moe.select_experts(probs, self.top_k)  # (N, k)
        if self.sink.buf is not None:
            self.sink.buf[:, self.index] = ids
        weights = moe.route_weights(probs, ids, self.norm_topk_prob)
        e = self.experts
        out = moe.expert_forward(flat, ids, weights, e.gate_up_proj, e.down_proj, first=e.first, impl=self.impl)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        if self.tp is not None:
            dist.all_reduce(out, group=self.tp.group)
        return out.view(shape)


class MoeDecoderLM(llama.DecoderLM):
    """`DecoderLM` whose sparse layers hold a `MoeMLP` (the others the dense MLP of
    `intermediate_size`, HF's `mlp_only_layers` / `decoder_sparse_step`)."""

    def __init__(self, config, max_positions: int | None = None):
        self.route_sink = RouteSink()
        self._sparse = {layer: i for i, layer in enumerate(moe.sparse_layers(config))}
        super().__init__(config, max_positions)

    @staticmethod
    def unsupported_reason(config) -> str | None:
        arch = moe.architecture(config)
        if arch not in moe.MOE_ARCHITECTURES:
            return f"architecture {arch} is not one of {', '.join(moe.MOE_ARCHITECTURES)}"
        if arch == "Qwen2MoeForCausalLM" and not getattr(config, "qkv_bias", True):
            return "Qwen2-MoE with qkv_bias=false"
        if not moe.sparse_layers(config):
            return "num_experts=0 (no sparse layer)"
        return llama.unsupported_reason(config, moe.MOE_ARCHITECTURES, arch)

    @staticmethod
    def family(config) -> str:
        return moe.MOE_ARCHITECTURES[moe.architecture(config)]

    @property
    def n_sparse(self) -> int:
        return len(self._sparse)

    def make_mlp(self, layer: int) -> nn.Module | None:
        i = self._sparse.get(layer)
        return None if i is None else MoeMLP(self.config, i, self.route_sink)

    def moe_layers(self) -> list[MoeMLP]:
        return [layer.mlp for layer in self.model.layers if isinstance(layer.mlp, MoeMLP)]

    def prefill_bytes_per_token(self) -> int:
        """Besides attention's: k rows per token through the sort, the grouped GEMMs (2I + I
        wide) and the weighted sum (float32), in 16-bit."""
        c = self.config
        k, h, i = c.num_experts_per_tok, c.hidden_size, c.moe_intermediate_size
        return 12 * h + 2 * k * (4 * h + 3 * i) + 4 * k * h

    @torch.no_grad()
    def load_expert(self, name: str, tensor: torch.Tensor) -> bool:
        """Copy a per-expert checkpoint weight (`...mlp.experts.{e}.{gate,up,down}_proj.weight`,
        the layout on disk) into the fused experts; False when `name` is not one. Experts held by
        another TP rank are skipped."""
        parts = name.split(".")
        if len(parts) < 4 or parts[-4] != "experts" or not parts[-3].isdigit() or parts[-1] != "weight":
            return False
        layer = self.model.layers[int(parts[parts.index("layers") + 1])].mlp
        e = int(parts[-3]) - layer.experts.first
        if not 0 <= e < layer.experts.gate_up_proj.shape[0]:
            return True
        inter = layer.experts.down_proj.shape[-1]
        target = {
            "gate_proj": layer.experts.gate_up_proj[e, :inter],
            "up_proj": layer.experts.gate_up_proj[e, inter:],
            "down_proj": layer.experts.down_proj[e],
        }.get(parts[-2])
        if target is None:
            return False
        target.copy_(tensor, non_blocking=True)
        return True
