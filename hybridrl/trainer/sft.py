"""Supervised fine-tuning (algorithm.name = sft): token-mean NLL on the response tokens only.

Shares the loop, checkpoints and tracking of every trainer (`loop.py`, `offline.py`); one step
is one optimizer step over data.train_batch_size rows.
"""

from __future__ import annotations

from hybridrl.data.batch import Batch
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.offline import OfflineTrainer


class SFTTrainer(OfflineTrainer):
    def __init__(self, cfg):
        super().__init__(cfg, need_ref=False)

    def update(self, batch: Batch) -> dict:
        timer = StageTimer()
        with timer("update_actor"):
            metrics = self.run.actor.update_sft(batch)
        return {**metrics, **timer.metrics()}
