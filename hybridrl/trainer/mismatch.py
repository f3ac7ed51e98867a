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
