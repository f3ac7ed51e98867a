"""The off-policy queue (trainer/async_rollout.py::OffPolicyRollouts) with a fake sampler: which
prompts each step trains on, with which policy version, and how far ahead it generates. No model,
no Ray: the bookkeeping alone, in milliseconds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.async_rollout import OffPolicyRollouts


class FakeSampler:
    """Generates a batch that carries its prompts' ids; logs (prompt id, trainer step at generation)."""

    def __init__(self, clock):
        self.clock, self.generated = clock, []

    def sample(self, prompts: Batch, timer, generated=None):
        pid = int(prompts[K.PROMPTS][0, 0])
        self.generated.append((pid, self.clock["step"]))
        batch = Batch({K.PROMPTS: prompts[K.PROMPTS].clone()}, {}, {})
        return batch, prompts, {}, {}


def _prompts(pid: int) -> Batch:
    return Batch({K.PROMPTS: torch.full((2, 3), pid)}, {}, {})


def _run(mode: str, max_staleness: int, total: int):
    cfg = SimpleNamespace(trainer=SimpleNamespace(mode=mode), async_training=SimpleNamespace(max_staleness=max_staleness))
    clock = {"step": 0}
    loader = iter(range(1, 100))  # the loop draws one prompt batch per step; the queue draws the ones ahead
    sampler = FakeSampler(clock)
    queue = OffPolicyRollouts(cfg, sampler, lambda: _prompts(next(loader)), lambda: clock["step"], total)
    trained = []
    for step in range(1, total + 1):
        clock["step"] = step
        batch, _, metrics, _ = queue.sample(_prompts(next(loader)), StageTimer())
        version = int(batch[K.ROLLOUT_POLICY_VERSION][0])
        trained.append((int(batch[K.PROMPTS][0, 0]), version, (step - 1) - version, metrics["async/queued_batches"]))
    return trained, sampler.generated


@pytest.mark.parametrize("mode,bound", [("sync", 0), ("one_step_off", 1), ("async", 2), ("async", 3)])
def test_each_step_trains_on_a_batch_at_most_depth_versions_old(mode, bound):
    trained, generated = _run(mode, bound, total=7)
    staleness = [s for _, _, s, _ in trained]
    # the first steps catch up to the bound, then every batch is exactly `bound` updates old
    assert staleness == [min(s, bound) for s in range(7)], staleness
    assert len(generated) == 7  # never past total_steps
    # generated in the loader's order, each batch trained exactly once, in the order generated
    assert [pid for pid, _, _, _ in trained] == [pid for pid, _ in generated]
    assert len({pid for pid, _ in generated}) == 7
    # the queue never holds more than `bound` batches ahead, and empties at the end
    assert max(q for *_, q in trained) <= bound and trained[-1][3] == 0
    # a batch was generated at the trainer step its version says (version = step - 1)
    by_pid = dict(generated)
    assert all(v == by_pid[pid] - 1 for pid, v, _, _ in trained)


def test_a_resumed_run_refills_the_queue_from_its_own_position():
    """After a resume the queue is empty: the first step generates its own batch and the ones ahead
    afresh with the resumed policy (staleness 0), as at the start."""
    cfg = SimpleNamespace(trainer=SimpleNamespace(mode="async"), async_training=SimpleNamespace(max_staleness=2))
    clock = {"step": 5}
    loader = iter(range(50, 100))
    sampler = FakeSampler(clock)
    queue = OffPolicyRollouts(cfg, sampler, lambda: _prompts(next(loader)), lambda: clock["step"], 8)
    batch, _, metrics, _ = queue.sample(_prompts(next(loader)), StageTimer())
    assert int(batch[K.ROLLOUT_POLICY_VERSION][0]) == 4 and metrics["async/staleness_max"] == 0.0
    assert [step for _, step in sampler.generated] == [5, 5, 5] and metrics["async/queued_batches"] == 2.0
