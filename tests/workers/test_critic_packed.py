"""The critic's value pass: packed, padded and token-budget micro-batches give the same values,
in the batch's row order."""

import torch

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.workers.critic import CriticWorker


def test_values_agree_across_packing_and_micro_batching(tiny_model_dir):
    cfg = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 7, "max_prompt_length": 4, "max_response_length": 6},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir, "random_init": True}, "actor": {"ppo_mini_batch_size": 7}},
            "critic": {"ppo_micro_batch_size_per_gpu": 7, "ppo_max_token_len_per_gpu": 12},
            "algorithm": {"adv_estimator": "gae"},
            "trainer": {"device": "cpu"},
        }
    )
    torch.manual_seed(0)
    w = CriticWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model(tiny_model_dir, True, 10)
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4])
    batch = Batch(
        {
            K.PROMPTS: torch.randint(2, 40, (7, 4), generator=g),
            K.PROMPT_MASK: torch.ones(7, 4, dtype=torch.long),
            K.RESPONSES: torch.randint(2, 40, (7, 6), generator=g),
            K.RESPONSE_MASK: (torch.arange(6)[None] < lengths[:, None]).float(),
        }
    )
    packed = w.compute_values(batch.select(batch.keys()))[K.VALUES]
    w.cfg.critic.use_dynamic_bsz = True  # 5 to 10 tokens per row, 12 per micro-batch: reordered groups
    dynamic = w.compute_values(batch.select(batch.keys()))[K.VALUES]
    w.engine.packing, w.cfg.critic.use_dynamic_bsz = None, False
    padded = w.compute_values(batch.select(batch.keys()))[K.VALUES]
    assert packed.abs().sum() > 0
    torch.testing.assert_close(dynamic, packed)
    torch.testing.assert_close(padded, packed, rtol=1e-5, atol=1e-6)
