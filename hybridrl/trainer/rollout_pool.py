"""The rollout pool (resource_pool.rollout) seen from the controller: generation on devices of its own.

The actor's pool trains; the rollout pool's ranks (workers/rollout.py) generate. Each generate
is submitted together with one `send_weights` on the actor's group, its pair in the weight
channel (distributed/weight_channel.py): the rollout ranks start every generate by receiving
the policy as it was when the call was submitted (or just a header when it has not changed).
Ray runs each process's calls in submission order, so the weights a generation gets are those
after every update submitted before it, and none after.

`submit` returns at once: the off-policy modes (trainer/async_rollout.py) queue a generation and
train on an earlier batch meanwhile. `generate` (sync mode, validation, ReMax's greedy
baselines) submits and waits. Either way, the rollout metrics of a batch include the send's
(timing_s/stage_weights, rollout_pool/bytes_sent) and the receive's (timing_s/update_weights).
"""

from __future__ import annotations

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rollout import SamplingParams


class PendingGeneration:
    """A submitted generation: `get()` waits for its batch."""

    def __init__(self, send, generation):
        self.send, self.generation = send, generation

    def get(self) -> Batch:
        batch = self.generation.get()
        metrics = batch.meta.setdefault(K.ROLLOUT_METRICS, {})
        metrics.update(self.send.get())
        return batch


class RolloutPool:
    """Generation on the rollout pool's group, with the actor's weights sent before each call."""

    in_process = False  # the pool's ranks are Ray processes: no per-sequence callbacks

    def __init__(self, actor, rollout):
        self.actor, self.rollout = actor, rollout
        self.sends = 0  # send_weights submitted: each generate receives every send up to its own

    @classmethod
    def connect(cls, actor, rollout) -> RolloutPool:
        """Open the weight channel: the actor's rank 0 hosts it, the pool's ranks join."""
        addr = actor.infos[0]["ip"]
        port = actor.host_weight_channel(addr)
        members = 1 + rollout.world_size
        joins = [group.submit("join_weight_channel", addr, port, members) for group in (actor, rollout)]
        for join in joins:
            join.get()
        return cls(actor, rollout)

    def submit(self, prompts: Batch, sampling: SamplingParams) -> PendingGeneration:
        """Send the current weights and start generating; returns without waiting for either."""
        send = self.actor.submit("send_weights")
        self.sends += 1
        return PendingGeneration(send, self.rollout.submit("generate", prompts, sampling, self.sends))

    def generate(self, prompts: Batch, sampling: SamplingParams, on_finish=None) -> Batch:
        """`submit` and wait (`on_finish` is not supported across processes: the batch is scored after)."""
        return self.submit(prompts, sampling).get()
