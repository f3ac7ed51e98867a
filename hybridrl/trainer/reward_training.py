"""Reward-model training (algorithm.name = rm): Bradley-Terry on preference pairs.

One step, on a batch of pairs {prompt, chosen, rejected, margin?} (hybridrl/data/preference.py):
    score chosen and rejected with the reward model (one forward pass over both)
    -> loss = -log sigmoid(r_chosen - r_rejected - margin)     (algorithms/preference.py)
    -> one optimizer step
The reward model is a sequence classifier (`workers/reward_model.py`) trained in the actor's place,
so checkpoints, resume and `hybridrl export` are the other offline trainers'; the exported directory
is what `reward_model.model.path` loads.

Metrics: rm/loss, rm/accuracy (share of pairs with r_chosen > r_rejected), rm/margin_mean (mean
r_chosen - r_rejected), rm/chosen_score, rm/rejected_score; on data.val_files the same under val/.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms import bradley_terry_loss
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import collate_records, load_preference_records
from hybridrl.models.loading import load_tokenizer
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.offline import OfflineTrainer


class RewardModelTrainer(OfflineTrainer):
    def __init__(self, cfg):
        super().__init__(cfg, need_ref=False)
        self.val_records = _val_pairs(cfg)

    def update(self, batch: Batch) -> dict:
        timer = StageTimer()
        with timer("update_actor"):
            metrics = self.run.actor.update_reward_model(batch)
        return {**metrics, **timer.metrics()}

    def has_validation(self) -> bool:
        return bool(self.val_records)

    def validate(self) -> dict:
        """The Bradley-Terry loss, accuracy and margins of the held-out pairs under the current model."""
        size = self.cfg.data.val_batch_size or self.cfg.data.train_batch_size
        chosen, rejected, margin = [], [], []
        for start in range(0, len(self.val_records), size):
            part = collate_records(self.val_records[start : start + size], self.run.pad_token_id)
            out = self.run.actor.score_pairs(part)
            chosen.append(out["chosen_scores"])
            rejected.append(out["rejected_scores"])
            margin.append(part[K.MARGIN])
        c, r, m = (torch.cat(x).double() for x in (chosen, rejected, margin))
        gap = c - r
        return {
            "val/rm/loss": float(bradley_terry_loss(c, r, m)["losses"].mean()),
            "val/rm/accuracy": float((gap > 0).double().mean()),
            "val/rm/margin_mean": float(gap.mean()),
            "val/rm/chosen_score": float(c.mean()),
            "val/rm/rejected_score": float(r.mean()),
            "val/rows": float(len(self.val_records)),
        }


def _val_pairs(cfg) -> list:
    d, m = cfg.data, cfg.actor_rollout_ref.model
    if not d.val_files:
        return []
    records = load_preference_records(
        d.val_files,
        load_tokenizer(m.tokenizer_path or m.path, m.trust_remote_code),
        "rm",
        prompt_key=d.prompt_key,
        max_prompt_length=d.max_prompt_length,
        max_response_length=d.max_response_length,
        truncation=d.truncation,
        seed=cfg.trainer.seed,
    )
    return records[: d.val_max_samples] if d.val_max_samples else records
