"""Every advantage estimator runs through the whole loop and updates the policy."""

import math

import pytest
import torch

from hybridrl.config import config_from_dict
from hybridrl.data import keys as K
from hybridrl.trainer.ppo import PPOTrainer


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus", "remax"])
def test_estimator_runs_and_updates(estimator, tiny_model_with_weights, arith_data, tmp_path):
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": tiny_model_with_weights},
                "actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-3}},
                "rollout": {"n": 3},
            },
            "algorithm": {"adv_estimator": estimator},
            "trainer": {
                "device": "cpu",
                "total_training_steps": 2,
                "default_local_dir": str(tmp_path),
                "logger": ["jsonl"],
                "val_before_train": False,
            },
        }
    )
    trainer = PPOTrainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.run.actor.worker.model.named_parameters()}
    seen = {}
    real_step = trainer.compute_advantages

    def spy(batch):
        out = real_step(batch)
        seen["batch"] = batch
        return out

    trainer.compute_advantages = spy
    metrics = trainer.fit()
    assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
    after = trainer.run.actor.worker.model.named_parameters()
    assert any(not torch.equal(before[n], p) for n, p in after)
    batch = seen["batch"]
    adv, mask = batch[K.ADVANTAGES], batch[K.RESPONSE_MASK]
    assert torch.all(adv[mask == 0] == 0)
    if estimator == "remax":
        assert batch[K.REWARD_BASELINES].shape == (12,)
        # baseline repeated over the n samples of each prompt
        assert torch.equal(batch[K.REWARD_BASELINES].view(4, 3), batch[K.REWARD_BASELINES].view(4, 3)[:, :1].expand(4, 3))
