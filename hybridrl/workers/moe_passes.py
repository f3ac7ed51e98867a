"""What a `TrainEngine`'s forward passes do with a mixture-of-experts model's routing
(models/moe_block.py); nothing for a dense model.

- Router replay (`actor_rollout_ref.actor.router_replay.mode`): with `replay` on, a pass over a
  micro-batch that carries ROUTED_EXPERTS (B, T, L, k) routes each token of each sparse layer to
  those experts instead of the router's own top-k (-1: its own). R3 (Ma et al. 2025, "Stabilizing
  MoE Reinforcement Learning by Aligning Training and Inference Routers") replays the rollout
  engine's routing, R2 the trainer's own old-log-prob pass, which records it (`recording`).
- The load-balancing loss (Switch/Qwen, `moe.load_balancing_loss`) enters an update's gradient
  with the model config's `router_aux_loss_coef`, each micro-batch weighted by its share of the
  mini-batch's tokens (`aux_share`, set by the engine).
- Metrics of an update's passes (`metrics`): the loss, the expert load per sparse layer
  (max / mean of the assignments per expert), the share of assignments over an even load (what a
  router with capacity factor 1 would drop; the routing here is dropless) and, when replaying,
  the share of replayed assignments the router would not have chosen itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from hybridrl.data import keys as K
from hybridrl.models.moe_block import MoeState, RoutingPass, routing


@dataclass
class Recording:
    """The routing a recorded pass used: (b, T, L, k) int16 in the micro-batch's (prompts | responses) layout."""

    routes: torch.Tensor | None = None


class MoEPasses:
    def __init__(self, state: MoeState | None):
        """`state`: the model's (`moe_block.adopt`), None for a dense model (every method a no-op)."""
        self.state = state
        self.replay = False  # replay ROUTED_EXPERTS when a micro-batch carries them
        self.aux_coef = float(getattr(state.config, "router_aux_loss_coef", 0.0) or 0.0) if state else 0.0
        self.aux_share = 1.0  # this micro-batch's share of the optimizer step's tokens (the engine sets it)
        self._recording: Recording | None = None
        self._sums: dict[str, torch.Tensor] = {}

    @property
    def active(self) -> bool:
        """The model has sparse layers (its passes need packed token positions)."""
        return self.state is not None

    @contextlib.contextmanager
    def replaying(self, on: bool):
        """Inside: replay on or off (the LoRA reference shares the policy's engine and routes itself)."""
        before, self.replay = self.replay, on
        try:
            yield
        finally:
            self.replay = before

    @contextlib.contextmanager
    def recording(self):
        """Inside: passes record the routing they used; the `Recording` yielded holds the last one's."""
        rec = self._recording = Recording()
        try:
            yield rec
        finally:
            self._recording = None

    @contextlib.contextmanager
    def pass_(self, micro, token_index: torch.Tensor | None, real: torch.Tensor, replayable: bool = True):
        """One forward pass over `micro`: packed (`token_index` (b, T) from `pack`) or padded
        (None: the (b, T) rows flattened). `real` (b, T): the real tokens of the micro-batch's
        prompts | completions. `replayable`: the completions are RESPONSES (what ROUTED_EXPERTS covers)."""
        if self.state is None:
            yield None
            return
        replay = None
        if self.replay and replayable and K.ROUTED_EXPERTS in micro:
            replay = _pack_routes(micro[K.ROUTED_EXPERTS], token_index)
        training = torch.is_grad_enabled()
        p = RoutingPass(
            replay=replay,
            mask=real.reshape(-1).bool() if token_index is None else None,  # padded: the loss and loads skip padding
            record=self._recording is not None,
            aux_weight=self.aux_coef * self.aux_share if training else 0.0,
            stats=training,
        )
        with routing(self.state, p):
            yield p
        if p.record:
            self._recording.routes = _unpack_routes(p, token_index, real.bool(), self.state)
        if p.stats:
            self._accumulate(p)

    def _accumulate(self, p: RoutingPass) -> None:
        L = self.state.n_sparse
        if len(p.loads) != L:
            return
        parts = {
            "loads": torch.stack([p.loads[i] for i in range(L)]),  # (L, E)
            "aux": torch.stack([p.aux[i] for i in range(L)]),  # (L,)
            "passes": torch.ones((), device=p.loads[0].device),
        }
        if len(p.replayed) == L:
            parts["replayed"] = torch.stack([p.replayed[i] for i in range(L)]).sum(0)  # (2,)
        for k, v in parts.items():
            self._sums[k] = v if k not in self._sums else self._sums[k] + v

    def metrics(self) -> dict[str, float]:
        """The MoE metrics of the passes since the last call (one device read), then reset:
        moe/aux_loss, moe/expert_load_max_over_mean (the most uneven sparse layer) and per layer,
        moe/overflow_frac, moe/replay_mismatch_frac when replaying."""
        sums, self._sums = self._sums, {}
        if not sums:
            return {}
        loads = sums["loads"]  # (L, E) assignments per expert over the passes
        mean = loads.mean(-1).clamp(min=1e-9)  # (L,)
        ratio = loads.max(-1).values / mean  # (L,)
        overflow = (loads - mean[:, None]).clamp(min=0).sum() / loads.sum().clamp(min=1e-9)
        values = {"moe/aux_loss": sums["aux"].mean() / sums["passes"], "moe/expert_load_max_over_mean": ratio.max()}
        values["moe/overflow_frac"] = overflow
        if "replayed" in sums:
            values["moe/replay_mismatch_frac"] = sums["replayed"][1] / sums["replayed"][0].clamp(min=1)
        for i, r in enumerate(ratio):
            values[f"moe/expert_load_max_over_mean/layer_{i}"] = r
        names = list(values)
        return dict(zip(names, torch.stack([values[n].float().cpu() for n in names]).tolist()))


def _pack_routes(routes: torch.Tensor, token_index: torch.Tensor | None) -> torch.Tensor:
    """ROUTED_EXPERTS (b, T, L, k) -> (N, L, k) in the pass's token order (-1 where none)."""
    if token_index is None:
        return routes.reshape(-1, *routes.shape[2:])
    keep = token_index >= 0
    out = routes.new_full((int(token_index.max()) + 1, *routes.shape[2:]), -1)
    out[token_index[keep]] = routes[keep]
    return out


def _unpack_routes(p: RoutingPass, token_index: torch.Tensor | None, real: torch.Tensor, state: MoeState) -> torch.Tensor:
    """The ids each sparse layer used, (N, k) per layer -> (b, T, L, k) int16, -1 on padding."""
    ids = torch.stack([p.recorded[i] for i in range(state.n_sparse)], dim=1)  # (N, L, k)
    b, T = real.shape
    if token_index is None:
        return ids.view(b, T, *ids.shape[1:]).masked_fill(~real[..., None, None], -1)
    out = ids.new_full((b, T, *ids.shape[1:]), -1)
    keep = token_index >= 0
    out[keep] = ids[token_index[keep]]
    return out
