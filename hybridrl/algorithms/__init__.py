"""RL math as pure tensor functions: advantages, losses, KL. No I/O, no distributed calls."""

from hybridrl.algorithms.advantages import (
    ADV_ESTIMATORS,
    ESTIMATOR_NEEDS,
    compute_gae_advantages,
    compute_grpo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    estimator_needs,
    get_adv_estimator,
    register_adv_estimator,
)
from hybridrl.algorithms.core import masked_mean, masked_sum, masked_var, masked_whiten
from hybridrl.algorithms.kl import (
    KL_TYPES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from hybridrl.algorithms.losses import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_entropy_loss,
    compute_policy_loss,
    compute_value_loss,
)
from hybridrl.algorithms.preference import DPO_LOSS_TYPES, dpo_loss, kto_kl_estimate, kto_loss, sft_loss

__all__ = [
    "DPO_LOSS_TYPES",
    "dpo_loss",
    "kto_kl_estimate",
    "kto_loss",
    "sft_loss",
    "ADV_ESTIMATORS",
    "ESTIMATOR_NEEDS",
    "KL_TYPES",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "compute_entropy_loss",
    "compute_gae_advantages",
    "compute_grpo_advantages",
    "compute_policy_loss",
    "compute_reinforce_plus_plus_advantages",
    "compute_remax_advantages",
    "compute_rloo_advantages",
    "compute_value_loss",
    "estimator_needs",
    "get_adv_estimator",
    "kl_penalty",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_estimator",
]
