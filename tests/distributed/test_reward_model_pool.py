"""The reward model on a Ray pool of its own: 2 actor processes + 1 reward-model process on CPU.
Its scores equal a direct forward of the same model, and the PPO step's score is the RM's."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from hybridrl.config import config_from_dict
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models.tiny import build_tokenizer, tiny_qwen2_config

pytestmark = pytest.mark.slow


def test_reward_model_on_its_own_pool(ray_session, tiny_model_dir, arith_data, tmp_path):
    from hybridrl.trainer.ppo import PPOTrainer

    tok = build_tokenizer()
    rm_dir = tmp_path / "rm"
    rm_dir.mkdir()
    (rm_dir / "config.json").write_text(
        json.dumps(tiny_qwen2_config(len(tok), architectures=["Qwen2ForSequenceClassification"], num_labels=1))
    )
    torch.manual_seed(3)
    rm = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(rm_dir), dtype=torch.float32)
    torch.nn.init.normal_(rm.score.weight, std=0.5)
    rm.save_pretrained(rm_dir)
    tok.save_pretrained(rm_dir)
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": tiny_model_dir, "random_init": True},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2},
                "rollout": {"n": 2},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "reward_model": {"enable": True, "model": {"path": str(rm_dir)}, "micro_batch_size_per_gpu": 3},
            "resource_pool": {"actor_rollout_ref": 2, "reward_model": 1},
            "trainer": {
                "device": "cpu",
                "n_gpus_per_node": 3,
                "logger": ["jsonl"],
                "val_before_train": False,
                "total_training_steps": 2,
                "default_local_dir": str(tmp_path / "run"),
            },
        }
    )
    trainer = PPOTrainer(cfg)
    backend = trainer.run.workers.backend
    assert backend.world_sizes() == {"actor_rollout_ref": 2, "reward_model": 1}
    assert len({pid for pids in backend.pids().values() for pid in pids}) == 3

    texts = ["1+2=3", "40+2=42", "7+7=1"]
    ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    batch = Batch(
        {
            K.PROMPTS: torch.tensor([[x[0]] for x in ids]),
            K.PROMPT_MASK: torch.ones(3, 1, dtype=torch.long),
            K.RESPONSES: torch.tensor([x[1:] + [0] * (8 - len(x)) for x in ids]),  # (3, 7), right-padded
            K.RESPONSE_MASK: torch.tensor([[1.0] * (len(x) - 1) + [0.0] * (8 - len(x)) for x in ids]),
        },
        {K.RAW_PROMPT: [t[0] for t in texts], K.RAW_CHAT: [None] * 3, K.RESPONSE_TEXT: [t[1:] for t in texts]},
    )
    scores = trainer.run.reward_model.compute_rm_score(batch)[K.RM_SCORES]
    with torch.no_grad():
        want = torch.stack([rm(input_ids=torch.tensor([x])).logits[0, 0] for x in ids])
    torch.testing.assert_close(scores, want, rtol=1e-4, atol=1e-5)

    last = trainer.fit()
    assert last["training/global_step"] == 2
    assert last["critic/score/mean"] == pytest.approx(last["reward_model/score/mean"], abs=1e-5)
    assert "timing_s/reward_model" in last and last["reward_model/score/max"] >= last["reward_model/score/min"]
