"""Wiring checks of the weight sync: the resharder refuses a TP rank the rollout layout does not
give this rank, and the trainer warns when the engine's and the trainer's probabilities of the
sampled tokens differ by more than numerics explain."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from hybridrl.distributed.reshard import Reshard
from hybridrl.trainer.alarms import PROBS_DIFF_WARN, Alarms, run_alarms


def rollout_mismatch_warning(metrics: dict, step: int, cfg) -> str | None:
    fired = Alarms(run_alarms(cfg)).check(metrics, step)
    return next((m for m in fired if "rollout_probs_diff" in m), None)


def _cfg(mode="sync", device="cpu"):
    return SimpleNamespace(trainer=SimpleNamespace(mode=mode, device=device))


def test_a_large_probability_gap_in_sync_mode_is_warned_on_cpu():
    big = {"training/rollout_probs_diff_max": 2e-2}  # what a mis-sharded LoRA delta gave on CPU
    message = rollout_mismatch_warning(big, 3, _cfg())
    assert message is not None and "step 3" in message and "0.02" in message and "weight sync" in message
    alarms = Alarms(run_alarms(_cfg()))
    assert len(alarms.check(big, 3)) == 1 and alarms.check(big, 4) == []  # once per run
    healthy = {"training/rollout_probs_diff_max": 3.7e-6, "training/rollout_probs_diff_mean": 2.7e-7}  # quickstart
    assert rollout_mismatch_warning(healthy, 3, _cfg()) is None
    # actor.reuse_on_policy_log_prob logs the mean alone: a stale engine is still caught on CPU
    assert rollout_mismatch_warning({"training/rollout_probs_diff_mean": 1.1e-2}, 3, _cfg()) is not None
    assert rollout_mismatch_warning(big, 3, _cfg(mode="one_step_off")) is None  # stale by design there
    assert rollout_mismatch_warning({}, 3, _cfg()) is None


def test_on_gpus_the_alarm_reads_the_mean_which_separates_bfloat16_numerics_from_stale_weights():
    # Healthy sync runs on one H200 (2026-11-29): the per-step max passed 0.2 in 72 of 193 PPO steps
    # (largest 0.53) while the mean stayed at 0.0020-0.0032; an engine left at the first weights gave
    # means of 0.011 (drift 0.008) and up (trainer/alarms.py).
    gpu = _cfg(device="cuda")
    worst_healthy = {"training/rollout_probs_diff_max": 0.53, "training/rollout_probs_diff_mean": 0.0032}
    assert rollout_mismatch_warning(worst_healthy, 72, gpu) is None
    assert rollout_mismatch_warning({"training/rollout_probs_diff_mean": 0.0032}, 5, gpu) is None  # reuse path
    for stale in (0.011, 0.021, 0.069):
        metrics = {"training/rollout_probs_diff_mean": stale, "training/rollout_probs_diff_max": 0.9}
        message = rollout_mismatch_warning(metrics, 9, gpu)
        assert message is not None and "rollout_probs_diff_mean" in message and "step 9" in message
    ((metric, level),) = PROBS_DIFF_WARN["gpu"]
    assert metric == "training/rollout_probs_diff_mean" and 0.0032 < level < 0.011
    assert rollout_mismatch_warning({"training/rollout_probs_diff_mean": 0.05}, 3, _cfg(mode="async", device="cuda")) is None


def test_the_resharder_refuses_a_tp_rank_unlike_the_layouts(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="outside 0..1"):
        Reshard(model, None, 2, 2)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        Reshard(model, None, 0, 2)  # rank 0 is tp rank 0 of its replica
        with pytest.raises(ValueError, match="rank 0 was given tp_rank 1, but the rollout layout makes it tp rank 0"):
            Reshard(model, None, 1, 2)
    finally:
        dist.destroy_process_group()


def test_the_improbable_token_alarm_fires_once_above_its_level():
    alarms = Alarms(run_alarms(_cfg(mode="one_step_off")))
    assert alarms.check({"rollout/improbable_token_frac": 3e-4}, 1) == []  # a correct sampler's own tail
    fired = alarms.check({"rollout/improbable_token_frac": 9e-3}, 2)  # what the +inf-noise bug drew
    assert len(fired) == 1 and "step 2" in fired[0] and "sampler" in fired[0]
    assert alarms.check({"rollout/improbable_token_frac": 9e-3}, 3) == []


def test_improbable_token_frac_counts_masked_tokens_below_1e6():
    from hybridrl.algorithms import improbable_token_frac

    lp = torch.log(torch.tensor([[0.5, 1e-7, 1e-5, 1e-9], [1e-8, 0.9, 0.1, 0.2]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    assert float(improbable_token_frac(lp, mask)) == pytest.approx(2 / 5)
