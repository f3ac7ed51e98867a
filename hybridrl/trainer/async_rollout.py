"""Off-policy rollouts: batches generated ahead of the trainer (trainer.mode one_step_off / async).

In sync mode a step generates its batch with the policy it then updates. Here the rollouts run
`depth` batches ahead (one_step_off: 1; async: async_training.max_staleness): at step s the
trainer updates on the batch generated at step s - depth, while the batch for step s + depth is
generated with the current weights. Policy version v = the updates applied before a sample was
generated (global_step - 1 at its generation), recorded per sample as ROLLOUT_POLICY_VERSION;
a batch trained at step s has staleness (s - 1) - v <= depth, never more.

The samples' behaviour log-probs (ROLLOUT_LOG_PROBS) are those of version v; the old log-probs
are recomputed by the current policy, so the truncated importance weight
min(pi_current / pi_behaviour, threshold) of `algorithms.rollout_correction` corrects the
staleness in the loss (`staleness_correction`: token-level TIS when no correction is configured).

Where generation runs: on the actor group's rollout engine, submitted before the step's
training calls. With colocated roles those calls run one after the other on the same devices,
so the modes differ in which policy generated the data, not in speed; the idle metrics say so.
With a rollout pool of its own (resource_pool.rollout, trainer/rollout_pool.py) the generation
of step s + depth is only submitted: the pool generates it while the actor trains on step s, and
the batch is collected (and scored) when its step comes; async/idle_s/rollout is then the pool's
own idle time between two generations, as its ranks measure it.
At a checkpoint the batches generated ahead are not saved: a resumed run generates its queue
afresh from the data position after them, so those prompts are skipped once (docs/async.md).

Metrics: async/staleness_mean, async/staleness_max, async/versions_per_batch,
async/idle_s/trainer (the step's wait for generation), async/idle_s/rollout (the time the
rollout engine waited between two generations: the training and logging in between).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.rollout_pool import PendingGeneration, RolloutPool


def depth(cfg) -> int:
    """Batches generated ahead of the trainer: 0 in sync mode."""
    mode = cfg.trainer.mode
    return {"sync": 0, "one_step_off": 1}.get(mode, cfg.async_training.max_staleness)


def staleness_correction(cfg):
    """algorithm.rollout_correction as the loss applies it: off-policy modes with no correction
    configured get token-level truncated importance sampling (threshold rollout_is_threshold)."""
    rc = cfg.algorithm.rollout_correction
    if depth(cfg) == 0 or rc.rollout_is is not None or rc.rollout_rs is not None:
        return rc
    rc = copy.copy(rc)
    rc.rollout_is = "token"
    return rc


def staleness_metrics(versions: torch.Tensor, current: int) -> dict[str, float]:
    """async/ metrics of a batch whose (B,) ROLLOUT_POLICY_VERSION are `versions`, trained by version `current`.

    >>> m = staleness_metrics(torch.tensor([3, 3, 2, 2]), current=4)
    >>> m["async/staleness_mean"], m["async/staleness_max"], m["async/versions_per_batch"]
    (1.5, 2.0, 2.0)
    """
    stale = (current - versions).double()
    return {
        "async/staleness_mean": float(stale.mean()),
        "async/staleness_max": float(stale.max()),
        "async/versions_per_batch": float(len(versions.unique())),
    }


class OffPolicyRollouts:
    """A RolloutSampler run `depth` batches ahead of the trainer; `sample` has the sampler's signature."""

    def __init__(
        self,
        cfg,
        sampler,
        next_prompts: Callable[[], Batch],
        global_step: Callable[[], int],
        total_steps: int,
        pool: RolloutPool | None = None,
    ):
        """`pool`: the rollout pool, whose generations are submitted without waiting (None: the
        sampler generates on the actor's group, in turn with the training calls)."""
        self.depth, self.sampler, self.next_prompts = depth(cfg), sampler, next_prompts
        self.global_step, self.total_steps, self.pool = global_step, total_steps, pool
        # (version, prompts, sampled (batch, prompts, rollout metrics, early scores) or a PendingGeneration)
        self.queue: deque[tuple[int, Batch, tuple | PendingGeneration]] = deque()
        self.queued_for = 0  # the last step the queue holds a batch for
        self.last_generated: float | None = None  # when the rollout engine last went idle

    def sample(self, prompts: Batch, timer: StageTimer) -> tuple[Batch, Batch, dict, dict]:
        """The batch of this step (generated up to `depth` updates ago), after generating ahead."""
        step = self.global_step()
        start = time.perf_counter()
        idle_rollout = 0.0 if self.last_generated is None else start - self.last_generated
        if not self.queue:  # the first step, or the first after a resume
            self.queued_for = step - 1
        # The loop drew `prompts` for this step: they are this step's when the queue is empty, else
        # (the loader runs `depth` batches ahead) the next batch to generate.
        sources = [prompts]
        while self.queued_for < min(step + self.depth, self.total_steps):
            self._generate(sources.pop() if sources else self.next_prompts(), step, timer)
        self.last_generated = time.perf_counter()
        version, prompts, sampled = self.queue.popleft()
        if isinstance(sampled, PendingGeneration):  # generated by the pool meanwhile: wait for it
            sampled = self.sampler.sample(prompts, timer, generated=sampled)
        batch, prompts, rollout_metrics, early = sampled
        batch[K.ROLLOUT_POLICY_VERSION] = torch.full((len(batch),), version, dtype=torch.long)
        waited = time.perf_counter() - start
        if self.pool is not None:
            idle_rollout = rollout_metrics.pop("async/idle_s/rollout", 0.0)
        rollout_metrics = {
            **rollout_metrics,
            **staleness_metrics(batch[K.ROLLOUT_POLICY_VERSION], step - 1),
            "async/idle_s/trainer": waited,
            "async/idle_s/rollout": idle_rollout,
            "async/queued_batches": float(len(self.queue)),
        }
        return batch, prompts, rollout_metrics, early

    def _generate(self, prompts: Batch, step: int, timer: StageTimer) -> None:
        """Generate (or, on a pool, submit) the next queued batch with the current policy, version step - 1."""
        if self.pool is not None:
            sampled = self.pool.submit(prompts, self.sampler.sampling)
        else:
            sampled = self.sampler.sample(prompts, timer)
        self.queue.append((step - 1, prompts, sampled))
        self.queued_for += 1
