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

# |p_engine - p_trainer| of the sampled tokens in sync mode past which the engine most likely samples
# with other weights (a missed or mis-sharded weight sync), by device: (metric, level).
# - CPU engines compute in float32: the largest gap of a healthy run is ~4e-6 and its per-step mean
#   ~3e-7 (the quickstart, 300 steps; ~2e-6 with TP and SP, tests/e2e/test_sp_tp_cli.py). The max
#   catches a single wrong token; the mean covers actor.reuse_on_policy_log_prob, which logs it alone.
# - GPU engines compute in bfloat16: a step's max is the tail of tens of thousands of tokens, and in a
#   healthy PPO run on one H200 it passed 0.2 in 72 of 193 steps (largest 0.53), so no level on the
#   max separates a bug from numerics. The per-step mean stayed at 0.0020-0.0032 in all 443 steps of
#   two healthy runs (GRPO and PPO, 2026-11-29), and bfloat16 against float32 on CPU gives the same
#   0.0030. An engine left at the first weights while the trainer moved gave means of 0.011, 0.021,
#   0.039 and 0.069 at drifts (mean log-ratio) of 0.008, 0.026, 0.084 and 0.30 (Qwen2.5-Coder-0.5B on
#   CPU; docs/observability.md, "Alarms"). 0.01 sits between the two: a never-synced engine passes it
#   while its drift from the first weights is still below 0.01 nats; one missed step (a drift near
#   1e-4) stays inside the numerics.
PROBS_DIFF_WARN = {
    "cpu": (("training/rollout_probs_diff_max", 1e-3), ("training/rollout_probs_diff_mean", 1e-4)),
    "gpu": (("training/rollout_probs_diff_mean", 1e-2),),
}


def run_alarms(cfg) -> tuple[Alarm, ...]:
    """The alarms of a run with config `cfg` (off-policy modes are stale by design: no mismatch alarm)."""
    out = [IMPROBABLE_TOKENS]
    if cfg.trainer.mode == "sync":
        advice = (
            "the rollout engine's and the trainer's probabilities of the same sampled tokens differ by more than "
            "numerics explain: the engine may be sampling with other weights (a missed or mis-sharded weight sync); "
            "the run goes on"
        )
        for metric, level in PROBS_DIFF_WARN["cpu" if cfg.trainer.device == "cpu" else "gpu"]:
            out.append(Alarm(metric, level, advice))
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
