"""The trainer's mixture-of-experts blocks: HF's sparse MLP blocks of a loaded Qwen3-MoE /
Qwen2-MoE model replaced in place (`adopt`) by `SparseMoeBlock`, which keeps HF's submodules and
so every parameter name (`mlp.gate.weight`, `mlp.experts.gate_up_proj`, ...: checkpoints, LoRA,
FSDP, the weight sync see the HF model) and adds what RL training needs:

- expert compute by grouped GEMMs (`moe.expert_forward`) instead of HF's loop over the hit
  experts, or by a dispatcher installed from outside (expert parallelism,
  `hybridrl.distributed.expert_parallel`);
- router replay: a pass (`routing`) may carry recorded expert ids per token and sparse layer
  (`RoutingPass.replay`, -1 = route freshly), which replace the router's own top-k; or record
  the top-k it chose (`RoutingPass.record`);
- the load-balancing loss (`moe.load_balancing_loss`), added to the gradient of whatever loss
  the pass's output feeds (`_AuxLoss`), and the expert-load statistics of the pass.

A pass is bound to each block by a pre-hook on its decoder layer, so it reaches the block also
when activation checkpointing re-runs the layer in the backward pass: recent transformers
checkpoint the layer's `forward` (the hook runs around `__call__` only, once); older ones
checkpoint `__call__`, and the hook, run again inside the backward, keeps the forward's pass.
The re-run reuses the experts the forward chose, so the recomputed activations, the replayed
routing and the load-balancing loss are those of the forward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from hybridrl.models import moe

# HF's sparse blocks (transformers 5: fused experts) that `adopt` replaces
HF_SPARSE_BLOCKS = ("Qwen3MoeSparseMoeBlock", "Qwen2MoeSparseMoeBlock")


@dataclass
class RoutingPass:
    """What one forward pass does with the routing of every sparse layer. N = the tokens of the
    pass, in the order its blocks see them (the packed row, or the padded rows flattened)."""

    replay: torch.Tensor | None = None  # (N, L, k) expert ids to use, -1 = the router's own
    mask: torch.Tensor | None = None  # (N,) real tokens (padded passes); None = all
    record: bool = False  # keep the ids each layer used (`recorded`)
    aux_weight: float = 0.0  # the load-balancing loss enters the gradient times this (0 = not at all)
    stats: bool = False  # accumulate the expert loads and replay agreement
    recorded: dict[int, torch.Tensor] = field(default_factory=dict)  # sparse layer -> (N, k)
    loads: dict[int, torch.Tensor] = field(default_factory=dict)  # sparse layer -> (E,) assignments
    aux: dict[int, torch.Tensor] = field(default_factory=dict)  # sparse layer -> the loss's value
    replayed: dict[int, torch.Tensor] = field(default_factory=dict)  # -> (replayed slots, those the router would not pick)


class MoeState:
    """Shared by the sparse blocks of one model: the pass in progress and how experts run."""

    def __init__(self, config, n_sparse: int):
        self.config, self.n_sparse = config, n_sparse
        self.n_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.current: RoutingPass | None = None
        self.impl = "auto"  # moe.IMPLS: grouped GEMMs on CUDA, the loop on CPU
        # experts of the tokens -> their outputs: the local grouped GEMMs, or the expert-parallel
        # all-to-all (distributed/expert_parallel.py installs it)
        self.dispatch: Callable | None = None


class _AuxLoss(torch.autograd.Function):
    """The identity on the block's output whose backward also sends `weight` to the loss value
    `aux`: the loss reaches the gradient without the objective knowing of it (Megatron's
    MoEAuxLossAutoScaler does the same)."""

    @staticmethod
    def forward(ctx, out, aux, weight: float):
        ctx.save_for_backward(aux)
        ctx.weight = weight
        return out

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.weight), None


class SparseMoeBlock(nn.Module):
    """HF's sparse MLP block (router `gate`, fused `experts`, Qwen2-MoE's shared expert) with
    grouped-GEMM experts, router replay and the load-balancing loss. Same parameters, same names."""

    def __init__(self, hf_block: nn.Module, state: MoeState, index: int):
        super().__init__()
        self.shared_expert = self.shared_expert_gate = None  # Qwen2-MoE's, set below
        for name, child in hf_block.named_children():  # in HF's order: parameters() lists them as HF's model does
            setattr(self, name, child)  # gate: router weight (E, H); experts: gate_up_proj, down_proj
        self.state, self.index = state, index  # index: among the sparse layers (the L of replay tensors)
        self.norm_topk_prob = bool(getattr(state.config, "norm_topk_prob", False))
        self.bound: RoutingPass | None = None
        self.fresh, self.used = True, None  # a re-run of the same pass reuses `used`

    def bind(self, routing: RoutingPass | None) -> None:
        """The pass this block's next forward belongs to (a decoder-layer pre-hook calls it)."""
        self.bound, self.fresh = routing, True

    @torch.compiler.disable
    def bind_current(self, layer, args) -> None:
        """The decoder layer's forward pre-hook: bind the model's pass in progress. A bound method,
        so that a deep copy of the model (the reference) hooks its own blocks. Called inside a
        backward pass, it is activation checkpointing re-running the layer with its hooks (the
        transformers releases that checkpoint `__call__`, not `forward`): the pass the forward
        bound, and the experts it chose, stay (the pass itself has ended by then)."""
        if _in_backward():
            return
        self.bind(self.state.current)

    @torch.compiler.disable  # data-dependent routing: runs eagerly inside a compiled layer
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        x = hidden.reshape(-1, shape[-1])  # (N, H)
        p, st = self.bound, self.state
        logits = F.linear(x, self.gate.weight)  # (N, E), in autocast's dtype when it is on
        probs = moe.router_probs(logits)
        if self.fresh:
            replay = p.replay[:, self.index] if p is not None and p.replay is not None else None
            self.used = moe.select_experts(probs, st.top_k, replay)  # (N, k)
            if p is not None:
                self._observe(p, probs, replay)
        self.fresh = False
        weights = moe.route_weights(probs, self.used, self.norm_topk_prob)  # (N, k)
        out = (st.dispatch or _local)(x, self.used, weights, self.experts, st)  # (N, H)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        if p is not None and p.aux_weight and torch.is_grad_enabled():
            aux = moe.load_balancing_loss(probs, self.used, p.mask)
            out = _AuxLoss.apply(out, aux, p.aux_weight / st.n_sparse)
        return out.view(shape)

    @torch.no_grad()
    def _observe(self, p: RoutingPass, probs: torch.Tensor, replay: torch.Tensor | None) -> None:
        ids = self.used
        if p.record:
            p.recorded[self.index] = ids.to(torch.int16)
        if not p.stats:
            return
        p.loads[self.index] = moe.expert_counts(ids, self.state.n_experts, p.mask)
        p.aux[self.index] = moe.load_balancing_loss(probs, ids, p.mask)
        if replay is not None:  # slots replayed, and those of them the router would not have picked itself
            own = probs.topk(self.state.top_k, dim=-1).indices
            used = replay[:, 0] >= 0
            if p.mask is not None:
                used &= p.mask.bool()
            differs = ~(ids[:, :, None] == own[:, None, :]).any(-1)  # (N, k)
            p.replayed[self.index] = torch.stack([used.sum() * ids.shape[1], (differs & used[:, None]).sum()]).float()


def _in_backward() -> bool:
    """Whether the autograd engine is running a backward pass on this thread (a checkpointed
    layer's recompute runs inside one)."""
    return torch._C._current_graph_task_id() != -1


def _local(x, ids, weights, experts, state: MoeState) -> torch.Tensor:
    """The experts of this rank, all of them: grouped GEMMs in autocast's dtype when it is on."""
    dev = x.device.type
    dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
    with torch.autocast(dev, enabled=False):
        return moe.expert_forward(
            x.to(dt), ids, weights, experts.gate_up_proj.to(dt), experts.down_proj.to(dt), impl=state.impl, out_dtype=x.dtype
        )


def adopt(model: nn.Module) -> MoeState | None:
    """Replace the HF sparse blocks of `model` (a loaded Qwen3-MoE / Qwen2-MoE model, maybe
    wrapped by peft) by `SparseMoeBlock`s sharing one `MoeState`, which it returns; None for a
    model without any (dense). Idempotent: a model adopted before returns its state."""
    found = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    if found:
        return found[0].state
    layers = [m for m in model.modules() if isinstance(getattr(m, "mlp", None), nn.Module)]
    sparse = [m for m in layers if type(m.mlp).__name__ in HF_SPARSE_BLOCKS]
    if not sparse:
        return None
    state = MoeState(_config_of(model), len(sparse))
    for i, layer in enumerate(sparse):
        layer.mlp = SparseMoeBlock(layer.mlp, state, i)
        layer.register_forward_pre_hook(layer.mlp.bind_current)
    return state


def _config_of(model: nn.Module):
    for m in model.modules():
        if hasattr(m, "config") and hasattr(m.config, "num_experts"):
            return m.config
    raise ValueError(f"{type(model).__name__} has sparse blocks but no config with num_experts")


def state_of(model: nn.Module) -> MoeState | None:
    """The `MoeState` of an adopted model, None for a dense one."""
    return next((m.state for m in model.modules() if isinstance(m, SparseMoeBlock)), None)


@contextlib.contextmanager
def routing(state: MoeState, p: RoutingPass):
    """Inside: the forward passes of the model run as pass `p` (each block binds it when its
    decoder layer is called)."""
    before, state.current = state.current, p
    try:
        yield p
    finally:
        state.current = before
