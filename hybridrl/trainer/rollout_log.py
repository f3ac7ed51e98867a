"""What the RL loop keeps of its generations: samples.jsonl and verl's rollout / validation dumps.

The trainer side of `hybridrl/tracking/samples.py`: it turns a step's `Batch` (or validation
rows) into prompt groups — every response of a prompt with its score and advantage — and
appends them. `trainer.log_samples` / `log_val_samples` prompts go to samples.jsonl;
`trainer.rollout_data_dir` / `validation_data_dir` get every sample.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hybridrl.algorithms import masked_mean
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.tracking.samples import append_jsonl, dump_rows, prompt_groups, write_dump


def log_train_samples(run_dir: Path, trainer_cfg, step: int, batch: Batch, scores: torch.Tensor) -> None:
    keep, dump_dir = trainer_cfg.log_samples, trainer_cfg.rollout_data_dir
    if keep <= 0 and not dump_dir:
        return
    mask = batch[K.RESPONSE_MASK]
    adv = masked_mean(batch[K.ADVANTAGES], mask, dim=-1) if K.ADVANTAGES in batch else None  # (B,) per-sequence mean
    groups = prompt_groups(
        step,
        "train",
        prompts=batch[K.RAW_PROMPT],
        responses=batch[K.RESPONSE_TEXT],
        scores=scores.tolist(),
        uids=batch[K.UID],
        ground_truths=batch[K.GROUND_TRUTH],
        data_sources=batch[K.DATA_SOURCE],
        advantages=adv.tolist() if adv is not None else None,
        lengths=mask.sum(-1).long().tolist(),
        limit=None if dump_dir else keep,
    )
    append_jsonl(run_dir / "samples.jsonl", groups[:keep])
    if dump_dir:
        write_dump(Path(dump_dir) / f"{step}.jsonl", dump_rows(groups))


def log_val_samples(run_dir: Path, trainer_cfg, step: int, rows: list[dict]) -> None:
    """`rows` as `trainer.scoring.evaluate` returns them (one per sample, `index` = the prompt)."""
    keep, dump_dir = trainer_cfg.log_val_samples, trainer_cfg.validation_data_dir
    if (keep <= 0 and not dump_dir) or not rows:
        return
    groups = prompt_groups(
        step,
        "val",
        prompts=[r["prompt"] for r in rows],
        responses=[r["response"] for r in rows],
        scores=[r["score"] for r in rows],
        uids=[r["index"] for r in rows],
        ground_truths=[r["ground_truth"] for r in rows],
        data_sources=[r["data_source"] for r in rows],
        lengths=[r["response_length"] for r in rows],
        limit=None if dump_dir else keep,
    )
    append_jsonl(run_dir / "samples.jsonl", groups[:keep])
    if dump_dir:
        write_dump(Path(dump_dir) / f"{step}.jsonl", dump_rows(groups))
