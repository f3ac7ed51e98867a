"""resource_pool.rollout=auto: how many of a node's devices the rollout pool gets, from measured step times.

Pure and torch-free: the numbers come from calibration steps run colocated in sync mode
(trainer/calibration.py), the answer is an int of rollout devices or None (stay colocated).

The model, per step, with n devices measured colocated and r of them given to the rollout pool:

    colocated sync      gen + other                                   (what was measured)
    rollout pool        tail * rounds(r) / rounds(n) + (engine - tail) * n / r + push
    trainer             other * n / (n - r) + push
    split step          max(rollout pool, trainer)

`engine` is the generation without the colocated engine's switching (`switch`: loading the
weights into it, waking and freeing its KV cache), which a pool that never trains does not do.
Each side scales data-parallel with its devices, except `tail`: the decode steps the longest
response needs, which no number of devices shortens (the long tail of response lengths); it only
grows with the generation rounds more sequences per device take. In one_step_off and async the
pool generates the next batch while the trainer updates on this one, so the steady-state step is
the slower side; a deeper async queue absorbs the variation of a step's generation time around
that mean but does not lower it. The weight push sits on both sides' paths (the actor sends
before the pool's next generate, which receives first).

With perfect data-parallel scaling (tail = 0) the best split at best equals colocated sync: the
split wins by what it removes (`switch`) and by the tail it does not pay n/r times. A split is
chosen only when it is predicted `min_gain` faster than colocated sync, since the model's
errors (a push slower than estimated, imperfect scaling) cost a split and not colocated sync.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepTimes:
    """One step's measured times (seconds), colocated in sync mode on all n devices."""

    gen: float  # timing_s/gen: generation, with the engine's weight load, wake and sleep
    other: float  # timing_s/step - gen: scoring, log-probs, updates, logging
    switch: float = 0.0  # of gen: timing_s/update_weights + rollout/wake_s + rollout/sleep_s
    push: float = 0.0  # estimated weight push to a rollout pool, per step
    tail: float = 0.0  # of gen: the longest response's decode (response_length/max x decode time per step)
    sequences: int = 0  # sequences generated per step (0: generation rounds not modelled)
    max_num_seqs: int = 0  # the engine's sequences at a time, per device


@dataclass(frozen=True)
class SplitDecision:
    rollout: int | None  # rollout devices per node; None = stay colocated (sync)
    step_s: float  # predicted steady-state step time of the choice
    colocated_s: float  # the measured colocated sync step
    predictions: dict[int, float]  # predicted split step time for every candidate r
    reason: str  # one line for the log


def rounds(times: StepTimes, devices: int) -> int:
    """Generation rounds on `devices`: the sequences per device over the engine's sequences at a time."""
    if not times.sequences or not times.max_num_seqs:
        return 1
    return math.ceil(math.ceil(times.sequences / devices) / times.max_num_seqs)


def split_step(times: StepTimes, n: int, r: int) -> tuple[float, float]:
    """(rollout pool, trainer) seconds per step with r of the n devices generating.

    >>> split_step(StepTimes(gen=2.0, other=2.0), n=4, r=2)
    (4.0, 4.0)
    >>> split_step(StepTimes(gen=2.0, other=2.0, tail=1.0), n=4, r=2)
    (3.0, 4.0)
    """
    engine = max(times.gen - times.switch, 0.0)
    tail = min(times.tail, engine)
    tail_r = tail * rounds(times, r) / rounds(times, n)
    pool = tail_r + (engine - tail) * n / r + times.push
    trainer = times.other * n / (n - r) + times.push
    return pool, trainer


def choose_split(n: int, times: StepTimes, min_gain: float = 0.1, candidates: list[int] | None = None) -> SplitDecision:
    """The rollout devices (of n per node) that minimise the predicted off-policy step time, or
    None when no split is predicted at least `min_gain` (a fraction) faster than colocated sync.
    `candidates`: the r the config allows (batch sizes that divide over n - r); default 1..n-1.

    The measured case of issue 41 (4 GPUs, generation 1.5 s of a 5.3 s step) stays colocated:

    >>> choose_split(4, StepTimes(gen=1.5, other=3.8)).rollout is None
    True
    """
    colocated = times.gen + times.other
    rs = [r for r in (range(1, n) if candidates is None else candidates) if 0 < r < n]
    predictions = {r: max(split_step(times, n, r)) for r in rs}
    if not predictions:
        return SplitDecision(
            None, colocated, colocated, {}, f"no split of {n} devices passes the config checks; staying colocated"
        )
    best = min(predictions, key=lambda r: (predictions[r], r))
    step = predictions[best]
    pool, trainer = split_step(times, n, best)
    sides = f"rollout {pool:.2f} s, trainer {trainer:.2f} s"
    limit = colocated * (1 - min_gain)
    if step > limit:
        return SplitDecision(
            None,
            colocated,
            colocated,
            predictions,
            f"staying colocated: the best split, {n - best} trainer + {best} rollout devices, is predicted at "
            f"{step:.2f} s per step ({sides}) against {colocated:.2f} s colocated sync (generation {times.gen:.2f} s), "
            f"not {min_gain:.0%} faster",
        )
    return SplitDecision(
        best,
        step,
        colocated,
        predictions,
        f"{n - best} trainer + {best} rollout devices: predicted {step:.2f} s per step ({sides}) against "
        f"{colocated:.2f} s colocated sync (generation {times.gen:.2f} s)",
    )


def measured_times(rows: list[dict], sequences: int = 0, max_num_seqs: int = 0) -> StepTimes:
    """StepTimes from calibration steps' metrics (the mean over `rows`, one dict per step):
    timing_s/gen and timing_s/step; the engine's switching (timing_s/update_weights,
    rollout/wake_s, rollout/sleep_s), whose weight load also estimates the push; and the tail,
    response_length/max decode steps at rollout/decode_ms_per_step (the native engine reports it;
    without it the tail is 0, the plain data-parallel model).

    >>> t = measured_times([{"timing_s/gen": 2.0, "timing_s/step": 5.0, "timing_s/update_weights": 0.1,
    ...                      "response_length/max": 1000, "rollout/decode_ms_per_step": 1.5}])
    >>> t.gen, t.other, t.switch, t.push, t.tail
    (2.0, 3.0, 0.1, 0.1, 1.5)
    """

    def mean(key: str) -> float:
        values = [float(r[key]) for r in rows if key in r]
        return sum(values) / len(values) if values else 0.0

    gen = mean("timing_s/gen")
    load = mean("timing_s/update_weights")
    return StepTimes(
        gen=gen,
        other=max(mean("timing_s/step") - gen, 0.0),
        switch=load + mean("rollout/wake_s") + mean("rollout/sleep_s"),
        push=load,
        tail=mean("response_length/max") * mean("rollout/decode_ms_per_step") / 1000,
        sequences=sequences,
        max_num_seqs=max_num_seqs,
    )
