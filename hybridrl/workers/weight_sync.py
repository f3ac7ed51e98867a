"""Keeping the rollout engine on the current policy: the one place that decides how weights move.

An engine with weights of its own (native, vLLM; LoRA; FSDP) gets the policy's weights before its
next generate, only when an optimizer step (or a checkpoint load) changed them since it last did:
- plain (`push`): the full tensors through `load_weights`;
- resharded (`push`, with a rollout tensor-parallel group): each rank's TP pieces cut straight
  from the FSDP shards (distributed/reshard.py), never a whole tensor on one rank; from a
  replicated model (fsdp_size=1) each rank cuts its slices from its own copy, with no communication;
- over the weight channel (`send`) to a rollout pool of its own (`resource_pool.rollout`).
The HF engine runs on the policy module itself and, under FSDP, needs its full (gathered)
weights for the whole generate (`serving`).
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from hybridrl.distributed.fsdp import full_weights, is_sharded
from hybridrl.distributed.layout import global_rank
from hybridrl.distributed.reshard import Reshard
from hybridrl.distributed.weight_channel import WeightChannel, WeightSender
from hybridrl.models.prepare import eager_layers


class WeightSync:
    def __init__(self, engine, policy, tp_group=None):
        """`engine`: the policy's TrainEngine (`steps_taken` counts weight changes); `policy`: its
        `PolicyWeights` (the full tensors, LoRA merged); `tp_group`: the rollout's tensor-parallel
        group (None: no TP)."""
        self.engine, self.policy, self.tp_group = engine, policy, tp_group
        self.synced_at = engine.steps_taken
        self.stale = False  # weights replaced by other means (a checkpoint load)
        self.sender: WeightSender | None = None  # rank 0's end of the weight channel (resource_pool.rollout)
        self._store = None

    def start_weights(self):
        """What a new engine starts from: None to build it over the policy module (it may alias the
        tensors), else the full tensors. LoRA: the merged policy (it never aliases the base); FSDP:
        gathered (it cannot alias shards); TP: full tensors, of which each rank keeps its slice.
        A replicated model (fsdp_size=1, `distributed/replicate.py`) is whole: aliased as on one device."""
        if self.policy.lora or is_sharded(self.engine.model) or self.tp_group is not None:
            return self.named_weights()
        return None

    def named_weights(self):
        """The policy's full (HF name, tensor) pairs, gathered under FSDP (a collective)."""
        return self.policy.named_weights(self.engine.model)

    @property
    def dirty(self) -> bool:
        """The policy moved since the engine last saw it."""
        return self.stale or self.engine.steps_taken != self.synced_at

    def mark_stale(self) -> None:
        self.stale = True

    def mark_synced(self) -> None:
        self.synced_at, self.stale = self.engine.steps_taken, False

    # -- a rollout pool of its own (distributed/weight_channel.py) ------------------------------
    def host_channel(self, addr: str) -> int:
        """Rank 0 hosts the channel's store: its port (0 on the other ranks)."""
        if global_rank() != 0:
            return 0
        self._store, port = WeightChannel.host(addr)
        return port

    def join_channel(
        self, addr: str, port: int, members: int, bucket_mb: float, checksum_interval: int = 0, staging: str = "auto"
    ) -> None:
        """Rank 0 becomes the channel's sender; the pool's replicas start from weights of their
        own, so the first send carries the whole policy. `checksum_interval`: every that many
        pushes, the receivers verify what they loaded (0: never); `staging`: where rank 0 keeps a
        push until they have it (rollout.update_weights_staging)."""
        if global_rank() == 0:
            channel = WeightChannel(addr, port, 0, members, self.engine.device)
            dtype = self.engine.amp or torch.float32
            self.sender = WeightSender(channel, self._store, dtype, bucket_mb, checksum_interval, staging)
        self.mark_stale()

    def send(self) -> dict[str, float]:
        """Every rank gathers the policy's full tensors when it moved (a collective), rank 0 stages
        them and starts the broadcasts; an unchanged policy sends only the header."""
        sender = self.sender
        if not self.dirty:
            if sender is not None:
                sender.send(None)
            return {}
        t0 = time.perf_counter()
        named = self.named_weights()
        metrics = {"rollout_pool/bytes_sent": 0.0}
        if sender is not None:
            # the policy's size before it is gathered: auto staging's choice for the first push
            numel = sum(p.numel() for p in self.engine.model.parameters())
            metrics.update(sender.send(named, numel))
        else:
            for _ in named:  # the other ranks' part of each gather
                pass
        self.mark_synced()
        return {"timing_s/stage_weights": time.perf_counter() - t0, **metrics}

    # -- an engine in this process -----------------------------------------------------------
    def push(self, rollout) -> dict[str, float]:
        """The policy's weights into `rollout` if they moved (resharded with a TP group); the time
        as a metric."""
        if not self.dirty:
            return {}
        if self.tp_group is not None:
            return self._push_resharded(rollout)
        t0 = time.perf_counter()
        rollout.load_weights(self.named_weights())
        device = self.engine.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.mark_synced()
        return {"timing_s/update_weights": time.perf_counter() - t0}

    def _push_resharded(self, rollout) -> dict[str, float]:
        """`push` to a tensor-parallel engine: a `Reshard`'s pieces (this rank's TP slices, cut
        from the FSDP shards without whole tensors), loaded as they come; the bytes this rank
        received against a full gather's as metrics."""
        t0 = time.perf_counter()
        model = self.engine.model
        reshard = Reshard(model, model.config, dist.get_rank(self.tp_group), dist.get_world_size(self.tp_group))
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
