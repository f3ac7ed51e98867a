"""Rule-based scoring on the controller, and evaluation (validation and `hybridrl eval`)."""

from __future__ import annotations

from collections import defaultdict
from functools import partial

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.dataset import PromptRecord, collate_prompts
from hybridrl.rewards import ScoreResult, score_batch
from hybridrl.rewards.managers import ManagedScorer
from hybridrl.rewards.registry import diagnostic_metrics
from hybridrl.rewards.remote import RemoteReward
from hybridrl.rollout import SamplingParams
from hybridrl.tracking.progress import bar


def last_token_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar score on its last response token: (B,) -> (B, R). The last
    token the model sampled: with multi-turn masks, tool tokens may sit between model tokens."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    cols = torch.arange(response_mask.shape[-1])
    last = torch.where(response_mask.bool(), cols, -1).max(-1).values.clamp(min=0)  # (B,)
    out[torch.arange(len(scores)), last] = scores.float()
    return out * response_mask


def score(batch: Batch, compute_score, with_extras: bool = False, result: ScoreResult | None = None):
    """Scores (B,) of the batch's responses and the reward metrics (errors, extra keys); with
    `with_extras`, also the reward function's other numeric keys, one list of values per key.
    `result`: the batch's scores computed already (while generating, trainer/stream_scoring.py)."""
    if result is None:
        # reward_model.reward_manager=batch|prime call the function their own way; naive and dapo: per sample
        # and the remote scorer sends concurrent requests (hybridrl/rewards/remote.py)
        batched = isinstance(compute_score, (ManagedScorer, RemoteReward))
        scorer = compute_score.score_batch if batched else partial(score_batch, compute_score)
        result = scorer(
            list(batch[K.DATA_SOURCE]),
            list(batch[K.RESPONSE_TEXT]),
            list(batch[K.GROUND_TRUTH]),
            list(batch[K.EXTRA_INFO]),
        )
    metrics = {"reward/errors": float(result.num_errors), "reward/timeouts": float(result.num_timeouts)}
    metrics.update({f"reward/{k}": float(v) for k, v in result.metrics.items()})
    for k, vals in result.extras.items():
        metrics[f"reward/{k}/mean"] = float(np.mean(vals))
    metrics.update(diagnostic_metrics(batch[K.DATA_SOURCE], batch[K.RESPONSE_TEXT], batch[K.GROUND_TRUTH]))
    scores = torch.tensor(result.scores, dtype=torch.float32)
    return (scores, metrics, result.extras) if with_extras else (scores, metrics)


def evaluate(engine, records: list[PromptRecord], sampling: SamplingParams, batch_size: int, compute_score, pad_token_id: int):
    """Generate for every record and score; returns (per-sample rows, metrics).

    `engine` is anything with `generate(prompts: Batch, sampling) -> Batch`: the actor's
    worker group or the rollout pool (trainer/rollout_pool.py) during training, or a bare
    rollout engine in `hybridrl eval`.
    Metrics: `val-core/<data_source>/reward/mean@<n>` (mean over all n samples of a prompt), and
    `val-aux/reward/errors`, `val-aux/reward/timeouts` (samples whose reward call failed: scored 0).
    """
    rows, per_source = [], defaultdict(list)
    failures = {"val-aux/reward/errors": 0.0, "val-aux/reward/timeouts": 0.0}
    shown = bar(len(records), "evaluating", unit="prompt")  # a terminal only (hybridrl/tracking/progress.py)
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        prompts = collate_prompts(chunk, pad_token_id, [str(start + i) for i in range(len(chunk))])
        out = engine.generate(prompts, sampling)
        scores, reward_metrics = score(out, compute_score)
        failures["val-aux/reward/errors"] += reward_metrics["reward/errors"]
        failures["val-aux/reward/timeouts"] += reward_metrics["reward/timeouts"]
        lengths = out[K.RESPONSE_MASK].sum(-1)
        for i in range(len(out)):
            source = out[K.DATA_SOURCE][i]
            per_source[source].append(float(scores[i]))
            rows.append(
                {
                    "index": start + i // sampling.n,
                    "data_source": source,
                    "prompt": out[K.RAW_PROMPT][i],
                    "response": out[K.RESPONSE_TEXT][i],
                    "ground_truth": out[K.GROUND_TRUTH][i],
                    "score": float(scores[i]),
                    "response_length": int(lengths[i]),
                }
            )
        shown.update(len(chunk))
    shown.close()
    metrics = {f"val-core/{s}/reward/mean@{sampling.n}": float(np.mean(v)) for s, v in per_source.items()}
    return rows, {**metrics, **failures}
