"""The base of the trainers that learn from a fixed dataset (DPO, KTO, SFT).

The loop, checkpoints, tracking and the non-finite guard are the RL trainer's (`loop.Trainer`);
what differs is the data (rows of data.train_files, no validation) and that a step is one batch
of rows and one optimizer step, with no generation. Subclasses define `update(batch) -> metrics`.
"""

from __future__ import annotations

from hybridrl.config import Config
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import MASK_OF, RecordLoader, load_preference_records
from hybridrl.trainer.loop import Trainer
from hybridrl.trainer.offline_eval import OfflineValidator
from hybridrl.trainer.setup import build_run


def record_data(cfg: Config):
    """`build_run`'s data hook: a resumable loader over the rows of data.train_files, no validation."""

    def load(tokenizer):
        d = cfg.data
        records = load_preference_records(
            d.train_files,
            tokenizer,
            cfg.algorithm.name,
            prompt_key=d.prompt_key,
            response_key=d.response_key,
            max_prompt_length=d.max_prompt_length,
            max_response_length=d.max_response_length,
            truncation=d.truncation,
            seed=cfg.trainer.seed,
        )
        seed = d.seed if d.seed is not None else cfg.trainer.seed  # data.seed, verl's name for the shuffle seed
        loader = RecordLoader(records, d.train_batch_size, tokenizer.pad_token_id, shuffle=d.shuffle, seed=seed)
        return loader, []

    return load


class OfflineTrainer(Trainer):
    def __init__(self, cfg: Config, need_ref: bool):
        super().__init__(cfg, build_run(cfg, data=record_data(cfg), need_ref=need_ref))
        self.validator = OfflineValidator.create(cfg, self.run)  # data.val_files; None without

    def update(self, batch: Batch) -> dict:
        """The optimizer step on one batch of rows (and what it needs first, e.g. reference log-probs)."""
        raise NotImplementedError

    def step(self, batch: Batch) -> dict:
        return {**self.update(batch), "perf/total_num_tokens": num_tokens(batch)}

    def rates(self, batch: Batch, metrics: dict, seconds: float) -> dict:
        return {**super().rates(batch, metrics, seconds), "perf/samples_per_s": len(batch) / seconds}

    def has_validation(self) -> bool:
        return self.validator is not None

    def validate(self) -> dict:
        return self.validator.evaluate()


def num_tokens(batch: Batch) -> float:
    """Prompt + completion tokens the step trained on (the prompt once per completion)."""
    masks = [batch[m] for key, m in MASK_OF.items() if key in batch and key != K.KL_RESPONSES]
    return float(batch[K.PROMPT_MASK].sum() * len(masks) + sum(m.sum() for m in masks))
