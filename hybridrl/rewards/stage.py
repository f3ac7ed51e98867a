"""The reward of an RL step: one stage over one `Scorer` (hybridrl/rewards/scorer.py) and, with
`reward_model.enable`, the reward model's.

    generate ─► start(batch): the rule scores now, or in the background while the log-prob passes
                run (reward_model.launch_reward_fn_async), or under way since generation (a stream,
                rewards/stream.py); the reward model's call submitted to its workers
    log-probs ─► finish(batch, pending): wait, combine, and write TOKEN_LEVEL_SCORES (the one place
                 the step's scores are written)

A response's rule score is shaped in this order: the scorer's score, plus the agent reward of a
multi-turn trajectory (what its tools and interactions gave), plus DAPO's overlong penalty
(`overlong_penalty`). With a reward model the step's score is

    reward_model.reward_weight x RM score + reward_model.rule_weight x shaped rule score

The defaults (1, 0) are verl's semantics: with a reward model, verl's naive reward manager returns the
RM scores and never calls the rule function. Here the rule score is still computed and logged, so that
the true task accuracy can be watched beside the RM score (reward hacking shows as the one rising while
the other does not). The score is placed on the last token the model sampled.

`score(batch)` scores at once (the rule scores, shaped): DAPO's group filter, ReMax's greedy
baselines and evaluation read it.

Metrics: reward/errors, reward/timeouts, reward/<key>/mean for the scorer's other numbers, its own
reward/<metric>s, the built-in diagnostics, reward/agent/mean, reward/overlong_reward/mean and
reward/overlong/mean (overlong_buffer.log), reward/score_s (deferred: the scoring's own time;
timing_s/reward is then the wait), reward/streamed_fraction; reward_model/score/{mean,max,min},
reward_model/rule_score/mean, reward_model/<metric> (the judge's judge_parse_errors).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch

from .registry import diagnostic_metrics
from .result import ScoreInputs, ScoreResult
from .scorer import Pending, Scorer
from .stream import ScoreStream


def inputs_of(batch: Batch) -> ScoreInputs:
    """What a scorer reads from a generated batch (DATA_SOURCE, RESPONSE_TEXT, GROUND_TRUTH, EXTRA_INFO)."""
    return ScoreInputs(batch[K.DATA_SOURCE], batch[K.RESPONSE_TEXT], batch[K.GROUND_TRUTH], batch[K.EXTRA_INFO], batch)


def last_token_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar score on its last response token: (B,) -> (B, R). The last
    token the model sampled: with multi-turn masks, tool tokens may sit between model tokens."""
    out = torch.zeros_like(response_mask, dtype=torch.float32)
    cols = torch.arange(response_mask.shape[-1])
    last = torch.where(response_mask.bool(), cols, -1).max(-1).values.clamp(min=0)  # (B,)
    out[torch.arange(len(scores)), last] = scores.float()
    return out * response_mask


def overlong_penalty(lengths: Sequence[int], max_response_length: int, buffer_len: int, penalty_factor: float) -> list[float]:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13), one value per response.

        expected = max_response_length - buffer_len
        penalty  = min(-(length - expected) / buffer_len * penalty_factor, 0)

    0 up to `expected` tokens, then falling linearly to -penalty_factor at max_response_length.

    >>> overlong_penalty([10, 12, 14, 16], max_response_length=16, buffer_len=4, penalty_factor=1.0)
    [0.0, 0.0, -0.5, -1.0]
    """
    if buffer_len <= 0:
        raise ValueError(f"reward_model.overlong_buffer.len must be > 0, got {buffer_len}")
    expected = max_response_length - buffer_len
    return [min(-(int(n) - expected) / buffer_len * penalty_factor, 0.0) + 0.0 for n in lengths]


def metrics_of(result: ScoreResult, inputs: ScoreInputs) -> dict[str, float]:
    """A scorer's result as reward/* metrics, with the built-in diagnostics of the responses."""
    metrics = {"reward/errors": float(result.num_errors), "reward/timeouts": float(result.num_timeouts)}
    metrics.update({f"reward/{k}": float(v) for k, v in result.metrics.items()})
    for k, vals in result.extras.items():
        metrics[f"reward/{k}/mean"] = float(np.mean(vals))
    metrics.update(diagnostic_metrics(inputs.data_sources, inputs.solution_strs, inputs.ground_truths))
    return metrics


@dataclass
class Scores:
    """A generated batch's rule-based reward, one value per response, before its placement on tokens."""

    values: torch.Tensor
    """(B,) float32: the scorer's score + the agent reward + the overlong penalty."""
    raw: torch.Tensor
    """(B,) float32: the scorer's score alone (evaluation, ReMax's baselines)."""
    extras: dict[str, list[float]] = field(default_factory=dict)
    """The scorer's other numbers per response (with the overlong penalty: `acc`, the score before it)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """reward/* of the batch."""

    def take(self, rows: Sequence[int]) -> Scores:
        """The responses `rows`, in that order; the batch's metrics kept."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        extras = {k: [v[r] for r in rows] for k, v in self.extras.items()}
        return Scores(self.values[index], self.raw[index], extras, dict(self.metrics))

    @staticmethod
    def concat(parts: Sequence[Scores]) -> Scores:
        """One after another (an extra a part lacks is 0.0 there); the metrics of the last part."""
        keys = dict.fromkeys(k for p in parts for k in p.extras)
        extras = {k: [x for p in parts for x in p.extras.get(k, [0.0] * len(p.values))] for k in keys}
        values, raw = torch.cat([p.values for p in parts]), torch.cat([p.raw for p in parts])
        return Scores(values, raw, extras, dict(parts[-1].metrics))


@dataclass
class EarlyScores:
    """How far a generation got with its own scoring: under way (`stream`, scored as responses ended)
    or done (`scores`: DAPO's group filter needed them); neither: `RewardStage.start` scores."""

    stream: ScoreStream | None = None
    scores: Scores | None = None


@dataclass
class StepPending:
    """What `RewardStage.start` began and `finish` waits for."""

    rule: Future  # of the rule's Scores
    model: Pending | None = None


class RewardStage:
    """See the module docstring. `scorer`: the rule-based / custom / remote scorer (`build_scorer`);
    `model`: the reward model's or the judge's (hybridrl/trainer/rm_scoring.py), or None.

    `defer`: rule scores computed in a background thread between `start` and `finish`; `decode`
    (the tokenizer's, for responses as the engine reports them): with `defer` and a scorer that
    streams, `stream` gives a `ScoreStream` to generate with. `agent`: the batches come from
    multi-turn rollouts (AGENT_REWARD). `overlong`: reward_model.overlong_buffer when enabled."""

    def __init__(
        self,
        scorer: Scorer,
        model: Scorer | None = None,
        *,
        defer: bool = False,
        decode: Callable[[list[np.ndarray]], list[str]] | None = None,
        agent: bool = False,
        overlong=None,
        max_response_length: int = 0,
        weights: tuple[float, float] = (1.0, 0.0),
    ):
        self.scorer, self.model, self.defer, self.decode = scorer, model, defer, decode
        self.agent, self.overlong, self.max_response_length = agent, overlong, max_response_length
        self.reward_weight, self.rule_weight = weights
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, cfg, scorer: Scorer, model: Scorer | None = None, decode=None) -> RewardStage:
        """reward_model.{launch_reward_fn_async, stream_reward_fn, overlong_buffer, reward_weight,
        rule_weight}. Deferred only in sync mode without algorithm.filter_groups (both need the
        scores at once)."""
        rm, a = cfg.reward_model, cfg.algorithm
        return cls(
            scorer,
            model,
            defer=rm.launch_reward_fn_async and cfg.trainer.mode == "sync" and not a.filter_groups.enable,
            decode=decode if rm.stream_reward_fn else None,
            agent=cfg.actor_rollout_ref.rollout.multi_turn.enable,
            overlong=rm.overlong_buffer if rm.overlong_buffer.enable else None,
            max_response_length=cfg.data.max_response_length,
            weights=(rm.reward_weight, rm.rule_weight),
        )

    # -- scoring at once -------------------------------------------------------------------------
    def score(self, batch: Batch) -> Scores:
        """The batch's rule scores, shaped, now."""
        inputs = inputs_of(batch)
        return self._shaped(batch, self.scorer.score(inputs), inputs)

    def _shaped(self, batch: Batch, result: ScoreResult, inputs: ScoreInputs) -> Scores:
        scores = torch.tensor(result.scores, dtype=torch.float32)
        raw, extras, metrics = scores, result.extras, metrics_of(result, inputs)
        if self.agent:  # multi-turn: what tools and interactions gave the trajectory
            metrics["reward/agent/mean"] = float(batch[K.AGENT_REWARD].mean())
            scores = scores + batch[K.AGENT_REWARD]
        ob = self.overlong
        if ob is not None:
            lengths = batch[K.RESPONSE_MASK].sum(-1).long().tolist()
            penalty = torch.tensor(overlong_penalty(lengths, self.max_response_length, ob.len, ob.penalty_factor))
            if ob.log:
                metrics["reward/overlong_reward/mean"] = float(penalty.mean())
                metrics["reward/overlong/mean"] = float((penalty < 0).float().mean())
            extras = {**extras, "acc": extras.get("acc", scores.tolist())}  # acc is the score before the penalty
            scores = scores + penalty
        return Scores(scores, raw, extras, metrics)

    # -- the step ----------------------------------------------------------------------------------
    def stream(self, prompts: Batch, n: int) -> ScoreStream | None:
        """A stream to pass as the engine's `on_finish` (`ScoreStream.finished`) when this run scores
        responses as they end (deferred, a decoder, a scorer that streams); else None."""
        if not (self.defer and self.decode is not None and self.scorer.streams):
            return None
        return ScoreStream(self.scorer, prompts, n, self.decode)

    def start(self, batch: Batch, early: EarlyScores, timer) -> StepPending:
        """Begin the scores of a generated batch (see the module docstring); `timer`: the step's StageTimer."""
        if early.scores is not None:
            rule = _done(early.scores)
        elif self.defer:
            # A view of its own: the step adds keys to the batch while the scoring reads it.
            view = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
            rule = self._background().submit(self._timed, view, early.stream)
        else:
            with timer("reward"):
                rule = _done(self.score(batch))
        model = None
        if self.model is not None:
            with timer("reward_model"):
                model = self.model.submit(inputs_of(batch))
        return StepPending(rule, model)

    def finish(self, batch: Batch, pending: StepPending, timer) -> dict[str, float]:
        """Wait for what `start` began; write TOKEN_LEVEL_SCORES (and RM_SCORES); the reward metrics.
        A scorer that failed as a whole (not one sample's call: that scores 0, counted) raises here."""
        with timer("reward"):
            rule = pending.rule.result()
        metrics, score = dict(rule.metrics), rule.values  # (B,)
        if pending.model is not None:
            with timer("reward_model"):
                result = pending.model.result()
            rm = torch.tensor(result.scores, dtype=torch.float32)  # (B,)
            batch[K.RM_SCORES] = rm
            score = self.reward_weight * rm + self.rule_weight * rule.values  # (B,)
            metrics.update({f"reward_model/{k}": float(v) for k, v in result.metrics.items()})
            metrics.update(
                {
                    "reward_model/score/mean": float(rm.mean()),
                    "reward_model/score/max": float(rm.max()),
                    "reward_model/score/min": float(rm.min()),
                    "reward_model/rule_score/mean": float(rule.values.mean()),
                }
            )
        batch[K.TOKEN_LEVEL_SCORES] = last_token_scores(score, batch[K.RESPONSE_MASK])
        return metrics

    # -- reward_model.launch_reward_fn_async -------------------------------------------------------
    def _background(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridrl-reward")
        return self._executor

    def _timed(self, batch: Batch, stream: ScoreStream | None) -> Scores:
        """The shaped scores, with reward/score_s (and, streamed, reward/streamed_fraction)."""
        t0 = time.perf_counter()
        inputs = inputs_of(batch)
        if stream is None:
            scores = self._shaped(batch, self.scorer.score(inputs), inputs)
            scores.metrics["reward/score_s"] = time.perf_counter() - t0
            return scores
        result, streamed = stream.result(batch)
        t1 = time.perf_counter()
        scores = self._shaped(batch, result, inputs)
        scores.metrics["reward/streamed_fraction"] = streamed / max(len(batch), 1)  # scored while generating
        scores.metrics["reward/score_s"] = stream.busy_s + time.perf_counter() - t1
        return scores

    def close(self) -> None:
        """Stop the background thread (the scorers are closed by their owner: the run)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def _done(scores: Scores) -> Future:
    future: Future = Future()
    future.set_result(scores)
    return future
