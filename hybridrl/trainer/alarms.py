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


IMPROBABLE_TOKENS = Alarm(
    "rollout/improbable_token_frac",
    # A correct sampler draws the policy's own tail: 1-3e-4 of the tokens of Qwen2.5-0.5B on
    # GSM8K at T = 1 (tests/gpu, 2026-11-28); the +inf-noise bug drew 9e-3. 1e-3 separates them.
    1e-3,
    f"sampled tokens the trainer gives probability < {IMPROBABLE_P:g}: the rollout engine draws tokens the "
    "policy would not (a sampler or weight-sync bug). Compare actor_rollout_ref.rollout.name=hf, and see "
    "samples.jsonl for the stray tokens.",
)

# Largest |p_engine - p_trainer| of a sampled token in sync mode that is numerics, not a bug: the
# engine computes in float32 on CPU (measured ~2e-6 with TP and SP, tests/e2e/test_sp_tp_cli.py),
# in bfloat16 on GPUs (0.14 at worst over 70k GSM8K tokens, tests/gpu). Past it the engine most
# likely samples with other weights (a missed or mis-sharded weight sync).
PROBS_DIFF_WARN = {"cpu": 1e-3, "gpu": 0.2}


def run_alarms(cfg) -> tuple[Alarm, ...]:
    """The alarms of a run with config `cfg` (off-policy modes are stale by design: no mismatch alarm)."""
    out = [IMPROBABLE_TOKENS]
    if cfg.trainer.mode == "sync":
        limit = PROBS_DIFF_WARN["cpu" if cfg.trainer.device == "cpu" else "gpu"]
        advice = (
            "the rollout engine's and the trainer's probabilities of the same sampled tokens differ by more than "
            "numerics explain: the engine may be sampling with other weights (a missed or mis-sharded weight sync); "
            "the run goes on"
        )
        out.append(Alarm("training/rollout_probs_diff_max", limit, advice))
    return tuple(out)


class Alarms:
    """Checks each step's metrics; each alarm warns at most once per run."""

    def __init__(self, alarms: tuple[Alarm, ...]):
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
