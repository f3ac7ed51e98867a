"""Evaluation (validation and `hybridrl eval`): generate for every record and score with the reward
stage (hybridrl/rewards/stage.py); and the tokenizer's decoding that the stage's stream uses."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from hybridrl.data import keys as K
from hybridrl.data.dataset import PromptRecord, collate_prompts
from hybridrl.rewards.stage import RewardStage
from hybridrl.rollout import SamplingParams
from hybridrl.tracking.progress import bar


def evaluate(
    engine, records: list[PromptRecord], sampling: SamplingParams, batch_size: int, reward: RewardStage, pad_token_id: int
):
    """Generate for every record and score (the scorer's own scores, unshaped); returns (per-sample rows, metrics).

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
        scored = reward.score(out)
        scores = scored.raw  # (B,)
        failures["val-aux/reward/errors"] += scored.metrics["reward/errors"]
        failures["val-aux/reward/timeouts"] += scored.metrics["reward/timeouts"]
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


def decode_responses(run) -> Callable[[list[np.ndarray]], list[str]] | None:
    """The run's tokenizer decoding responses as the native engine does (special tokens dropped)."""
    tokenizer = getattr(run, "tokenizer", None)
    if tokenizer is None:
        return None
    return lambda tokens: tokenizer.batch_decode([t.tolist() for t in tokens], skip_special_tokens=True)
