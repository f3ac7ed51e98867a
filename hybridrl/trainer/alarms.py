"""Once-per-run warnings from a step's metrics: numbers that mean the run is broken, not slow.

Each alarm names a metric, the level past which it fires, and what to do. It fires once per run
(the first step past the level), on the console, with the step and the value; the metric itself
is logged every step, so the curve shows how long the problem lasted.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.algorithms import IMPROBABLE_P


@dataclass(frozen=True)
class Alarm:
    metric: str
    above: float
    advice: str


ALARMS = (
    Alarm(
        "rollout/improbable_token_frac",
        # A correct sampler draws the policy's own tail: 1-3e-4 of the tokens of Qwen2.5-0.5B on
        # GSM8K at T = 1 (tests/gpu, 2026-11-28); the +inf-noise bug drew 9e-3. 1e-3 separates them.
        1e-3,
        f"sampled tokens the trainer gives probability < {IMPROBABLE_P:g}: the rollout engine draws tokens the "
        "policy would not (a sampler or weight-sync bug). Compare actor_rollout_ref.rollout.name=hf, and see "
        "samples.jsonl for the stray tokens.",
    ),
)


class Alarms:
    """Checks each step's metrics; each alarm warns at most once per run."""

    def __init__(self, alarms: tuple[Alarm, ...] = ALARMS):
        self.alarms, self.fired = alarms, set()

    def check(self, metrics: dict, step: int) -> list[str]:
        out = []
        for a in self.alarms:
            value = metrics.get(a.metric)
            if a.metric in self.fired or value is None or not value > a.above:
                continue
            self.fired.add(a.metric)
            out.append(f"[hybridrl] warning at step {step}: {a.metric} = {value:.3g} (> {a.above:g}): {a.advice}")
            print(out[-1], flush=True)
        return out
