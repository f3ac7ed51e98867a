"""Keeping the rollout engine on the current policy.

An engine with weights of its own (native, vLLM; LoRA; FSDP) gets the policy's weights through
`load_weights` before its next generate, only when an optimizer step (or a checkpoint load)
changed them since it last did; the HF engine runs on the policy module itself and, under FSDP,
needs its full (gathered) weights for the whole generate.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch

from hybridrl.distributed.fsdp import full_weights
from hybridrl.models.prepare import eager_layers


class WeightSync:
    def __init__(self, engine):
        self.engine = engine  # the policy's TrainEngine: `steps_taken` counts weight changes
        self.synced_at = engine.steps_taken
        self.stale = False  # weights replaced by other means (a checkpoint load)

    @property
    def dirty(self) -> bool:
        """The policy moved since the engine last saw it."""
        return self.stale or self.engine.steps_taken != self.synced_at

    def mark_stale(self) -> None:
        self.stale = True

    def mark_synced(self) -> None:
        self.synced_at, self.stale = self.engine.steps_taken, False

    def send(self, sender, named_weights) -> dict[str, float]:
        """To a rollout pool of its own (`distributed.weight_channel`): every rank gathers the
        policy's full tensors when it moved (a collective), rank 0 (`sender`; None elsewhere)
        stages them and starts the broadcasts; an unchanged policy sends only the header."""
        if not self.dirty:
            if sender is not None:
                sender.send(None)
            return {}
        t0 = time.perf_counter()
        named = named_weights()
        if sender is not None:
            sent = sender.send(named)
        else:
            sent = 0.0
            for _ in named:  # the other ranks' part of each gather
                pass
        self.mark_synced()
        return {"timing_s/stage_weights": time.perf_counter() - t0, "rollout_pool/bytes_sent": sent}

    def push(self, rollout, named_weights) -> dict[str, float]:
        """`rollout.load_weights(named_weights())` if the policy moved; its time as a metric."""
        if not self.dirty:
            return {}
        t0 = time.perf_counter()
        rollout.load_weights(named_weights())
        device = self.engine.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.mark_synced()
        return {"timing_s/update_weights": time.perf_counter() - t0}

    def push_resharded(self, rollout, make_reshard) -> dict[str, float]:
        """Like `push`, for a tensor-parallel engine: `make_reshard()` is a `distributed.reshard.Reshard`
        whose pieces (this rank's TP slices, cut from the FSDP shards without whole tensors) the
        engine loads as they come; the bytes this rank received against a full gather's as metrics."""
        if not self.dirty:
            return {}
        t0 = time.perf_counter()
        reshard = make_reshard()
        rollout.load_weights(reshard.pieces(), sharded=True)
        device = self.engine.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.synced_at, self.stale = self.engine.steps_taken, False
        return {
            "timing_s/update_weights": time.perf_counter() - t0,
            "reshard/bytes_per_rank": float(reshard.bytes_received),
            "reshard/full_gather_bytes_per_rank": float(reshard.full_gather_bytes),
        }

    @contextmanager
    def serving(self, rollout):
        """Inside: the policy module ready for `rollout.generate` (not its compiled training layers;
        gathered, when the engine runs on it under FSDP: ranks may decode different numbers of
        steps, with no collectives)."""
        model = self.engine.model
        on_policy = rollout.model is model
        with full_weights(model) if on_policy else nullcontext(), eager_layers(model):
            yield
