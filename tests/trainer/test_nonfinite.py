"""A run whose loss goes non-finite skips those updates and stops with a clear message."""

import pytest
from torch.distributed.checkpoint import FileSystemReader

from hybridrl.algorithms.policy_losses import POLICY_LOSSES
from hybridrl.config import config_from_dict
from hybridrl.trainer.ppo import NonFiniteError, PPOTrainer


def test_stops_after_max_nonfinite_steps_and_keeps_last_checkpoint(tiny_model_with_weights, arith_data, tmp_path, monkeypatch):
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": tiny_model_with_weights},
                "actor": {"ppo_mini_batch_size": 4},
                "rollout": {"n": 2},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {
                "device": "cpu",
                "total_training_steps": 6,
                "save_freq": 1,
                "max_nonfinite_steps": 2,
                "default_local_dir": str(tmp_path),
                "logger": ["jsonl"],
                "val_before_train": False,
            },
        }
    )
    trainer = PPOTrainer(cfg)
    real = POLICY_LOSSES["vanilla"]  # the policy loss the actor calls (policy_loss.loss_mode)
    calls = {"n": 0}

    def poisoned(**kw):
        out = real(**kw)
        calls["n"] += 1
        if calls["n"] > 1:  # the first step is healthy, then every loss is NaN
            out["pg_loss"] = out["pg_loss"] * float("nan")
        return out

    monkeypatch.setitem(POLICY_LOSSES, "vanilla", poisoned)
    with pytest.raises(NonFiniteError, match="2 updates in a row"):
        trainer.fit()
    # the healthy step's optimizer state (Adam moments) was saved, in the sharded format
    saved = FileSystemReader(str(tmp_path / "checkpoints" / "step_1" / "actor" / "optim")).read_metadata()
    assert any(key.startswith("state.") and key.endswith("exp_avg") for key in saved.state_dict_metadata)
    # step 2 skipped its update (saved), step 3 hit the limit before saving
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_2"
