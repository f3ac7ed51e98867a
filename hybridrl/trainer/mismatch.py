"""Train/rollout mismatch correction on the controller (algorithm.rollout_correction, verl's keys).

After the old log-probs are recomputed, the ratio pi_old / pi_rollout of every sampled token is
known; `algorithms.rollout_correction` turns it into truncated importance weights (stored as
ROLLOUT_IS_WEIGHTS, which the policy loss multiplies in) and a rejection mask (applied to
RESPONSE_MASK, so advantages and losses skip the rejected tokens), with rollout_corr/ metrics.
"""

from __future__ import annotations

from hybridrl.algorithms.rollout_correction import compute_rollout_correction
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch


def enabled(rc) -> bool:
    """Whether any correction is asked for (bypass mode needs none: the old log-probs are the engine's)."""
    return not rc.bypass_mode and (rc.rollout_is is not None or rc.rollout_rs is not None)


def correct_rollout_mismatch(batch: Batch, rc) -> dict[str, float]:
    """Reads OLD_LOG_PROBS, ROLLOUT_LOG_PROBS, RESPONSE_MASK; writes ROLLOUT_IS_WEIGHTS (with rollout_is)
    and the rejected tokens out of RESPONSE_MASK (with rollout_rs). Returns the rollout_corr/ metrics."""
    weights, mask, metrics = compute_rollout_correction(
        old_log_prob=batch[K.OLD_LOG_PROBS],
        rollout_log_prob=batch[K.ROLLOUT_LOG_PROBS],
        response_mask=batch[K.RESPONSE_MASK],
        rollout_is=rc.rollout_is,
        rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
        rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold,
    )
    batch[K.RESPONSE_MASK] = mask
    if weights is not None:
        batch[K.ROLLOUT_IS_WEIGHTS] = weights.to(batch[K.OLD_LOG_PROBS].dtype)
    return metrics


# Largest |p_engine - p_trainer| of a sampled token in sync mode that is numerics, not a bug: the
# engine computes in float32 on CPU (measured ~2e-6 with TP and SP, tests/e2e/test_tp_rollout_cli.py),
# in bfloat16 on GPUs (a few 1e-2 at worst). Past it the engine most likely samples with other weights.
PROBS_DIFF_WARN = {"cpu": 1e-3, "gpu": 0.2}


def rollout_mismatch_warning(metrics: dict, step: int, cfg) -> str | None:
    """The warning for a sync-mode step whose engine and trainer probabilities of the same sampled
    tokens differ by more than numerics explain, else None (the loop prints it once per run)."""
    diff = metrics.get("training/rollout_probs_diff_max")
    if diff is None or cfg.trainer.mode != "sync":
        return None
    limit = PROBS_DIFF_WARN["cpu" if cfg.trainer.device == "cpu" else "gpu"]
    if diff <= limit:
        return None
    return (
        f"[hybridrl] warning: step {step}: the rollout engine's and the trainer's probabilities of the same sampled "
        f"tokens differ by up to {diff:.3g} (training/rollout_probs_diff_max; numerics stay under {limit:g} here): "
        "the engine may be sampling with other weights (a missed or mis-sharded weight sync); the run goes on"
    )
