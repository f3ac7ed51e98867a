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
    return next((m for m in fired if "rollout_probs_diff_max" in m), None)


def _cfg(mode="sync", device="cpu"):
    return SimpleNamespace(trainer=SimpleNamespace(mode=mode, device=device))


def test_a_large_probability_gap_in_sync_mode_is_warned():
    big = {"training/rollout_probs_diff_max": 2e-2}  # what a mis-sharded LoRA delta gave on CPU
    message = rollout_mismatch_warning(big, 3, _cfg())
    assert message is not None and "step 3" in message and "0.02" in message and "weight sync" in message
    alarms = Alarms(run_alarms(_cfg()))
    assert len(alarms.check(big, 3)) == 1 and alarms.check(big, 4) == []  # once per run
    assert rollout_mismatch_warning({"training/rollout_probs_diff_max": 2e-6}, 3, _cfg()) is None
    assert rollout_mismatch_warning(big, 3, _cfg(device="cuda")) is None  # bfloat16 engines differ this much
    assert rollout_mismatch_warning({"training/rollout_probs_diff_max": 0.5}, 3, _cfg(device="cuda")) is not None
    assert rollout_mismatch_warning(big, 3, _cfg(mode="one_step_off")) is None  # stale by design there
    assert rollout_mismatch_warning({}, 3, _cfg()) is None
    assert PROBS_DIFF_WARN["cpu"] < 2e-2


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
