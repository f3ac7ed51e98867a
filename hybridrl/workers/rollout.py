"""Rollout replicas on devices of their own (`resource_pool.rollout`, verl's standalone rollout).

Each rank of the rollout pool holds the policy's architecture and a generation engine, and no
trainer: its weights come from the actor's rank 0 over a `WeightChannel`
(`distributed/weight_channel.py`) at the start of every `generate`, which the controller pairs
with one `ActorRolloutRefWorker.send_weights` (trainer/rollout_pool.py). While this pool
generates, the actor's pool trains: the off-policy modes (trainer.mode one_step_off / async)
overlap the two.
"""

from __future__ import annotations

import time

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.layout import global_rank
from hybridrl.distributed.weight_channel import WeightChannel, WeightReceiver, drain
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.rollout.base import Hooks, SamplingParams
from hybridrl.rollout.factory import build_rollout
from hybridrl.workers.engine import autocast_dtype
from hybridrl.workers.profiled import ProfiledWorker


class RolloutWorker(ProfiledWorker):
    profile_role = "rollout"

    def __init__(self, cfg, plan, device: torch.device):
        self.cfg, self.plan, self.device = cfg, plan, device
        self.receiver: WeightReceiver | None = None
        self.loaded = False  # weights were loaded since the last generate's metrics
        self.partial: PartialRollout | None = None
        self.last_end: float | None = None  # when the previous generate returned: the pool's idle time
        self.verified = 0  # pushes whose checksums matched (rollout.weight_checksum_interval)
        self.checksum_ms = [0.0, 0.0]  # checksum time since the last generate's metrics: this rank's, the sender's

    @register(Dispatch.ALL)
    def init_model(self, model_path: str, random_init: bool) -> None:
        """The policy's architecture on this device (its weights arrive before the first generate)
        and the configured engine over it."""
        m, r, data = self.cfg.actor_rollout_ref.model, self.cfg.actor_rollout_ref.rollout, self.cfg.data
        self.tokenizer = load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code)
        model = load_causal_lm(
            model_path, random_init=random_init, override_config=m.override_config, trust_remote_code=m.trust_remote_code
        )
        amp = autocast_dtype(self.device)
        self.model = model.to(self.device, dtype=amp or torch.float32).eval().requires_grad_(False)
        partial = self.cfg.async_training.partial_rollout  # build_rollout refuses an engine that cannot swap
        self.rollout = build_rollout(
            r,
            self.model,
            self.tokenizer,
            max_model_len=data.max_prompt_length + data.max_response_length,
            autocast_dtype=amp,
            partial_rollout=partial,
            record_routing=self.cfg.actor_rollout_ref.actor.router_replay.mode == "R3",
        )
        self.params = dict(self.model.named_parameters())
        if partial:
            self.partial = PartialRollout(self)
        if r.weight_checksum_interval and self.rollout.model is None:
            raise ValueError(
                f"actor_rollout_ref.rollout.weight_checksum_interval={r.weight_checksum_interval} verifies the weights "
                f"the engine holds, and rollout.name={r.name} does not show them; use native or hf, or set it to 0"
            )

    @register(Dispatch.ALL)
    def join_weight_channel(self, addr: str, port: int, members: int) -> None:
        """Member 1 + this rank of the channel the actor's rank 0 hosts."""
        channel = WeightChannel(addr, port, 1 + global_rank(), members, self.device)
        self.receiver = WeightReceiver(channel)

    def _catch_up(self, through: int) -> dict[str, float]:
        """Receive the sends up to number `through` (the one paired with this generate; earlier
        ones a partial rollout did not take); their time and the weights' version as metrics."""
        t0 = time.perf_counter()
        while self.receiver.received < through:
            self._receive()
        metrics = {"rollout_pool/weights_version": float(self.receiver.version)}
        if self.cfg.actor_rollout_ref.rollout.weight_checksum_interval:
            metrics["rollout_pool/checksums_verified"] = float(self.verified)  # in the run so far
            metrics["rollout_pool/checksum_ms"], metrics["rollout_pool/sender_checksum_ms"] = self.checksum_ms
            self.checksum_ms = [0.0, 0.0]
        if self.loaded:
            metrics["timing_s/update_weights"] = time.perf_counter() - t0
            self.loaded = False
        return metrics

    def _receive(self) -> None:
        """One send: the policy's weights into the engine when they changed, else nothing."""
        params = self.params if self.rollout.model is self.model else None  # the hf engine runs on the module itself
        times = load_push(self.receiver, self.rollout, self.device, params)
        if times is None:
            return
        self.loaded = True
        if times:  # a verified push
            self.verified += 1
            self.checksum_ms = [self.checksum_ms[0] + times["receiver_ms"], self.checksum_ms[1] + times["sender_ms"]]

    @register(Dispatch.DP, mesh="rollout")
    def generate(self, prompts: Batch, sampling: SamplingParams, through: int) -> Batch:
        """Receive the weights of every send up to number `through` (the paired send_weights),
        then generate as the actor's `generate` does (the same outputs and metrics). With
        async_training.partial_rollout, weights sent while this generate runs are loaded between
        two decode steps and decoding goes on with them (ROLLOUT_TOKEN_VERSION per token)."""
        start = time.perf_counter()
        metrics = self._catch_up(through)
        if self.last_end is not None:  # the time this pool had nothing to do since its last generate
            metrics["async/idle_s/rollout"] = start - self.last_end
        self.rollout.wake()
        t0 = time.perf_counter()
        out = self.rollout.generate(prompts, sampling, Hooks(weight_swap=self.partial))
        if self.partial is not None:
            metrics.update(self.partial.metrics(out))
        self.last_end = time.perf_counter()
        metrics["rollout_pool/generate_s"] = self.last_end - t0
        metrics.update(self.rollout.last_metrics)
        out.meta[K.ROLLOUT_METRICS] = metrics
        return out


def load_push(receiver: WeightReceiver, rollout, device: torch.device, params: dict | None = None) -> dict[str, float] | None:
    """One send of the weight channel into `rollout`: None when the policy had not changed. Else
    the tensors are loaded (`rollout.load_weights`, or copied into `params`, the module's own
    parameters by name, for an engine that runs on the module) and, on a verified push
    (rollout.weight_checksum_interval), what the engine then holds is checked against the
    sender's checksums: returns their times ({} when not verified)."""
    pieces = receiver.receive()
    if pieces is None:
        return None
    try:
        if params is not None:
            with torch.no_grad():
                for name, tensor in pieces:
                    if name not in params:
                        raise KeyError(f"the trainer sent {name!r}, which the rollout pool's model does not have")
                    params[name].copy_(tensor)
        else:
            rollout.load_weights(pieces)
    finally:
        drain(pieces)  # also after an error: the sender's broadcasts must all be matched
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not receiver.verify_pending:
        return {}
    held = dict(rollout.model.named_parameters(remove_duplicate=False))
    return receiver.verify(held, f"rollout rank {global_rank()}'s {type(rollout).__name__}")


class PartialRollout:
    """The engine's `Hooks.weight_swap` (async_training.partial_rollout): between decode steps, at most
    every `interval_s`, a look at the channel's send count; new weights are received and loaded
    in place, and decoding continues with them."""

    def __init__(self, worker: RolloutWorker, interval_s: float = 0.01):
        self.worker, self.interval_s = worker, interval_s
        self.checked = 0.0
        self.swaps, self.swap_s = 0, 0.0

    @property
    def version(self) -> int:
        return self.worker.receiver.version

    def ready(self) -> bool:
        now = time.perf_counter()
        if now - self.checked < self.interval_s:
            return False
        self.checked = now
        return self.worker.receiver.available() > 0

    def swap(self) -> int:
        before, t0 = self.version, time.perf_counter()
        self.worker._receive()  # a header-only send (the policy had not changed) loads nothing
        self.worker.loaded = False  # its time is this call's, not the next catch-up's
        self.swap_s += time.perf_counter() - t0
        self.swaps += self.version != before
        return self.version

    def metrics(self, out: Batch) -> dict[str, float]:
        """Weight changes loaded during the call, and the share of response tokens sampled by
        newer weights than their sequence's first token."""
        versions, mask = out[K.ROLLOUT_TOKEN_VERSION], out[K.RESPONSE_MASK]
        newer = (versions > versions[:, :1]).float() * mask
        metrics = {
            "rollout_pool/partial_swaps": float(self.swaps),
            "rollout_pool/partial_swap_s": self.swap_s,  # receiving and loading them, decoding paused
            "rollout_pool/partial_token_share": float(newer.sum() / mask.sum().clamp(min=1)),
        }
        self.swaps, self.swap_s = 0, 0.0
        return metrics
