"""DPO and KTO on the workers of the RL loop (algorithm.name = dpo | kto).

One step, as in the papers:
    reference log-probs (once per batch, or precomputed for the whole set)
    -> KTO only: the KL reference point z0 from mismatched prompt/completion pairs
    -> one optimizer step on the preference loss (hybridrl/algorithms/preference.py)
The reference is the frozen initial policy held by the actor worker (`need_ref`); there is
no second trainable copy.
"""

from __future__ import annotations

import time

from hybridrl.algorithms import kto_kl_estimate
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import COMPLETIONS, REF_OF, collate_records
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.offline import OfflineTrainer


class PreferenceTrainer(OfflineTrainer):
    def __init__(self, cfg):
        super().__init__(cfg, need_ref=True)
        self.kind = cfg.algorithm.name
        self.ref_outputs = {key: REF_OF[key] for key in COMPLETIONS[self.kind]}  # completion -> its ref log-prob
        self.precomputed = cfg.preference.precompute_ref_log_probs
        if self.precomputed:
            self.precompute_reference()

    def update(self, batch: Batch) -> dict:
        actor, timer = self.run.actor, StageTimer()
        if not self.precomputed:
            with timer("ref"):
                batch = actor.sequence_log_probs(batch, self.ref_outputs)
        kl_ref_point = 0.0
        if self.kind == "kto":
            with timer("kl"):
                batch = actor.sequence_log_probs(batch, {K.KL_RESPONSES: K.POLICY_KL_LOGPS}, reference=False)
                kl_ref_point = float(kto_kl_estimate(batch[K.POLICY_KL_LOGPS], batch[K.REF_KL_LOGPS]))
        with timer("update_actor"):
            metrics = actor.update_preference(batch, kl_ref_point)
        return {**metrics, **timer.metrics()}

    def precompute_reference(self) -> None:
        """Reference log-probs of every training row, once; the loader then carries them.

        The reference model is freed afterwards unless checkpoints must carry it (random init or
        a warm-up: it could not be rebuilt from model.path on resume).
        """
        run, t0 = self.run, time.perf_counter()
        records, size = run.loader.records, self.cfg.data.train_batch_size
        for start in range(0, len(records), size):
            part = records[start : start + size]
            out = run.actor.sequence_log_probs(collate_records(part, run.pad_token_id), self.ref_outputs)
            for i, r in enumerate(part):
                r.ref_logps = {key: float(out[key][i]) for key in self.ref_outputs.values()}
        if not run.save_ref:
            run.actor.release_reference()
        print(f"[hybridrl] reference log-probs of {len(records)} rows precomputed in {time.perf_counter() - t0:.1f}s", flush=True)
