"""The loop shared by the trainers that learn from a fixed dataset (DPO, KTO, SFT).

Same plumbing as the RL loop — `build_run` (workers, frozen reference, resume), checkpoints,
tracking, the non-finite guard — but a step is one batch of rows and one optimizer step, with no
generation. Subclasses define `step(batch) -> metrics`.
"""

from __future__ import annotations

import time

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import MASK_OF, RecordLoader, load_preference_records
from hybridrl.trainer.offline_eval import OfflineValidator
from hybridrl.trainer.ppo import NonFiniteError, _fault_injection_point
from hybridrl.trainer.setup import RunContext, build_run


def record_data(cfg):
    """`build_run`'s data hook: a resumable loader over the rows of data.train_files, no validation."""

    def load(tokenizer):
        d = cfg.data
        records = load_preference_records(
            d.train_files, tokenizer, cfg.algorithm.name, prompt_key=d.prompt_key,
            max_prompt_length=d.max_prompt_length, max_response_length=d.max_response_length,
            truncation=d.truncation, seed=cfg.trainer.seed,
        )  # fmt: skip
        loader = RecordLoader(records, d.train_batch_size, tokenizer.pad_token_id, shuffle=d.shuffle, seed=cfg.trainer.seed)
        return loader, []

    return load


class OfflineTrainer:
    def __init__(self, cfg, need_ref: bool):
        self.cfg = cfg
        self.run: RunContext = build_run(cfg, data=record_data(cfg), need_ref=need_ref)
        self.validator = OfflineValidator.create(cfg, self.run)  # data.val_files; None without

    def step(self, batch: Batch) -> dict:
        raise NotImplementedError

    def fit(self) -> dict:
        run, cfg = self.run, self.cfg
        if run.global_step == 0:
            before = dict(run.trainer_state.pop("warmup_metrics", {}))
            if self.validator and cfg.trainer.val_before_train:
                before.update(self.validator.evaluate())
            if before:
                run.tracker.log(before, step=0)
        metrics: dict = {}
        while run.global_step < run.total_steps:
            run.global_step += 1
            t0 = time.perf_counter()
            batch = run.loader.next_batch()
            with run.profiled():
                metrics = self.step(batch)
            seconds = time.perf_counter() - t0
            metrics.update({
                "timing_s/step": seconds,
                "perf/total_num_tokens": num_tokens(batch),
                "perf/throughput": num_tokens(batch) / seconds,
                "perf/samples_per_s": len(batch) / seconds,
                "training/global_step": run.global_step,
                "training/epoch": run.loader.epoch,
            })  # fmt: skip
            if self.validator and self.validator.due(run.global_step, run.is_last_step()):
                metrics.update(self.validator.evaluate())
            run.tracker.log(metrics, step=run.global_step)
            if metrics["actor/nonfinite_in_a_row"] >= cfg.trainer.max_nonfinite_steps:
                raise NonFiniteError(
                    f"actor: {int(metrics['actor/nonfinite_in_a_row'])} updates in a row had a non-finite gradient "
                    f"norm (trainer.max_nonfinite_steps={cfg.trainer.max_nonfinite_steps}); the last good checkpoint "
                    "is intact. Lower actor_rollout_ref.actor.optim.lr or enable grad_clip."
                )
            last = run.is_last_step()
            if last or (cfg.trainer.save_freq > 0 and run.global_step % cfg.trainer.save_freq == 0):
                run.save_checkpoint({})
                _fault_injection_point(run.global_step)
            if last:
                break
        run.finish()
        return metrics


def num_tokens(batch: Batch) -> float:
    """Prompt + completion tokens the step trained on (the prompt once per completion)."""
    masks = [batch[m] for key, m in MASK_OF.items() if key in batch and key != K.KL_RESPONSES]
    return float(batch[K.PROMPT_MASK].sum() * len(masks) + sum(m.sum() for m in masks))
