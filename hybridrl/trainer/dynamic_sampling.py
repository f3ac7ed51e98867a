"""Rollouts of one RL step: generate, score, shape, and DAPO's dynamic sampling.

Without `algorithm.filter_groups.enable` a step generates `rollout.n` responses for its prompts
and scores them, once. With it (DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.2) a prompt
whose responses all got the same `filter_groups.metric` (all right or all wrong) is dropped: its
group-relative advantages would all be 0 and it would only shrink the gradient. The step then
draws `data.gen_batch_size` more prompts and generates again, until `data.train_batch_size`
prompts with varied outcomes are collected (the surplus is cut, whole groups at a time), or
gives up after `filter_groups.max_num_gen_batches` rounds.

Metrics: train/num_gen_batches (generation rounds this step, verl's name),
train/num_groups_generated and train/num_groups_kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch, pad_sequence_layout
from hybridrl.rewards.manager import ScoreResult
from hybridrl.rewards.managers import overlong_penalty
from hybridrl.tracking.progress import ticker
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.scoring import last_token_scores, score
from hybridrl.trainer.stream_scoring import StreamScorer, streamable

_LEFT_PADDED = (K.PROMPTS, K.PROMPT_MASK)
_PROMPT_FIELDS = (K.PROMPTS, K.PROMPT_MASK, K.UID, K.DATA_SOURCE, K.GROUND_TRUTH, K.EXTRA_INFO, K.RAW_PROMPT)


class DynamicSamplingError(RuntimeError):
    """Too few prompts with varied outcomes within filter_groups.max_num_gen_batches rounds."""


class RolloutSampler:
    """generate -> score (reward manager) -> overlong shaping -> [keep groups whose metric varies, repeat]."""

    def __init__(
        self,
        cfg,
        actor,
        compute_score,
        sampling,
        next_prompts: Callable[[], Batch],
        defer: bool = False,
        decode: Callable[[list], list[str]] | None = None,
    ):
        """`defer` (reward_model.launch_reward_fn_async): a round's scores are computed in a
        background thread while the caller goes on; `join` adds them. Not with the group filter,
        which needs them at once. With `decode` (the tokenizer's decoding of a response) and the
        actor in this process, scoring starts during generation, as each response ends
        (trainer/stream_scoring.py); the engines that do not report them are scored after."""
        self.cfg, self.actor, self.compute_score, self.sampling = cfg, actor, compute_score, sampling
        self.next_prompts = next_prompts
        self.filter = cfg.algorithm.filter_groups
        self.defer = defer and not self.filter.enable
        self.stream = self.defer and decode is not None and getattr(actor, "in_process", False) and streamable(compute_score)
        self.decode = decode
        self.pending: Future | None = None
        self._executor: ThreadPoolExecutor | None = None

    def sample(self, prompts: Batch, timer: StageTimer, generated=None) -> tuple[Batch, Batch, dict, dict]:
        """(responses with TOKEN_LEVEL_SCORES, the prompts they answer, rollout metrics, reward metrics).
        `generated`: the responses to `prompts` submitted earlier (a rollout pool's pending
        generation, trainer/rollout_pool.py): waited for and scored instead of generating."""
        if generated is not None or not self.filter.enable:
            batch, rollout_metrics, reward_metrics, _ = self._round(prompts, timer, generated)
            return batch, prompts, rollout_metrics, reward_metrics
        want, n = self.cfg.data.train_batch_size, self.sampling.n
        kept: list[Batch] = []
        rounds = generated = groups_kept = 0
        rollout_metrics, reward_metrics = {}, {}
        while True:
            rounds += 1
            batch, rollout_metrics, reward_metrics, extras = self._round(prompts, timer)
            batch[K.UID] = [f"{u}#g{rounds}" for u in batch[K.UID]]  # a prompt drawn twice stays two groups
            rows, groups = varied_groups(batch[K.UID], self._metric_values(batch, extras))
            generated += groups
            groups_kept += len(rows) // n if len(rows) else 0
            if len(rows):
                kept.append(batch.index(rows))
            if groups_kept >= want:
                break
            limit = self.filter.max_num_gen_batches
            if 0 < limit <= rounds:
                raise DynamicSamplingError(
                    f"algorithm.filter_groups: after {rounds} generation rounds ({generated} prompts) only {groups_kept} "
                    f"prompts had responses whose {self.metric} differed, fewer than data.train_batch_size={want}; raise "
                    f"algorithm.filter_groups.max_num_gen_batches (<= 0 = no limit), data.gen_batch_size or "
                    f"actor_rollout_ref.rollout.n, or check that the reward can vary"
                )
            prompts = self.next_prompts()
        batch = concat_padded(kept).index(slice(0, want * n))
        metrics = {
            **rollout_metrics,
            "train/num_gen_batches": rounds,
            "train/num_groups_generated": generated,
            "train/num_groups_kept": groups_kept,
        }
        return batch, prompts_of(batch, n), metrics, reward_metrics

    @property
    def metric(self) -> str:
        return self.filter.metric or "acc"

    def _round(self, prompts: Batch, timer: StageTimer, generated=None) -> tuple[Batch, dict, dict, dict]:
        """One generation: (batch with TOKEN_LEVEL_SCORES, rollout metrics, reward metrics, the
        scorer's extras). With `defer`, the scores are computed in the background: the batch
        comes back without them and `join` adds them."""
        stream = StreamScorer(self.compute_score, prompts, self.sampling.n, self.decode) if self.stream else None
        try:
            with timer("gen"), ticker(f"generating {len(prompts)} x {self.sampling.n} responses"):
                if generated is not None:
                    batch = generated.get()
                elif stream is not None:
                    batch = self.actor.generate(prompts, self.sampling, on_finish=stream.finished)
                else:
                    batch = self.actor.generate(prompts, self.sampling)
        except BaseException:
            if stream is not None:
                stream.close()
            raise
        rollout_metrics = batch.meta.pop(K.ROLLOUT_METRICS, {})
        if self.defer:
            # A view of its own: the step adds keys to the batch while the scorer reads it.
            view = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
            self.pending = self._pool().submit(self._timed_scores, view, stream)
            return batch, rollout_metrics, {}, {}
        with timer("reward"):
            batch[K.TOKEN_LEVEL_SCORES], reward_metrics, extras = self._scores(batch)
        return batch, rollout_metrics, reward_metrics, extras

    def _scores(self, batch: Batch, result: ScoreResult | None = None) -> tuple[torch.Tensor, dict, dict]:
        """(TOKEN_LEVEL_SCORES, reward metrics, the scorer's extras) of a generated batch
        (`result`: its scores, when they were computed while generating)."""
        scores, reward_metrics, extras = score(batch, self.compute_score, with_extras=True, result=result)
        if K.AGENT_REWARD in batch:  # multi-turn: what tools and interactions gave the trajectory
            reward_metrics["reward/agent/mean"] = float(batch[K.AGENT_REWARD].mean())
            scores = scores + batch[K.AGENT_REWARD]
        ob = self.cfg.reward_model.overlong_buffer
        if ob.enable:
            lengths = batch[K.RESPONSE_MASK].sum(-1).long().tolist()
            penalty = torch.tensor(overlong_penalty(lengths, self.cfg.data.max_response_length, ob.len, ob.penalty_factor))
            if ob.log:
                reward_metrics["reward/overlong_reward/mean"] = float(penalty.mean())
                reward_metrics["reward/overlong/mean"] = float((penalty < 0).float().mean())
            extras = {**extras, "acc": extras.get("acc", scores.tolist())}  # acc is the score before the penalty
            scores = scores + penalty
        return last_token_scores(scores, batch[K.RESPONSE_MASK]), reward_metrics, extras

    # -- reward_model.launch_reward_fn_async ---------------------------------------------------
    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridrl-reward")
        return self._executor

    def _timed_scores(self, batch: Batch, stream: StreamScorer | None = None):
        t0 = time.perf_counter()
        if stream is None:
            scores, metrics, _ = self._scores(batch)
            return scores, metrics, time.perf_counter() - t0
        result, streamed = stream.result(batch)
        t1 = time.perf_counter()
        scores, metrics, _ = self._scores(batch, result)
        metrics["reward/streamed_fraction"] = streamed / max(len(batch), 1)  # scored while generating
        return scores, metrics, stream.busy_s + time.perf_counter() - t1

    def join(self, batch: Batch, timer: StageTimer) -> dict:
        """The deferred scores of the last round into `batch` (TOKEN_LEVEL_SCORES); their reward
        metrics, with reward/score_s (the scoring's own time; timing_s/reward is the wait).
        A reward function's error is raised here. Nothing to do when scoring was not deferred."""
        if self.pending is None:
            return {}
        pending, self.pending = self.pending, None
        with timer("reward"):
            batch[K.TOKEN_LEVEL_SCORES], metrics, seconds = pending.result()
        return {**metrics, "reward/score_s": seconds}

    def _metric_values(self, batch: Batch, extras: dict) -> np.ndarray:
        """One value of filter_groups.metric per response."""
        name = self.metric
        if name in ("seq_reward", "seq_final_reward"):  # no KL penalty yet at this point: both are the shaped score
            return batch[K.TOKEN_LEVEL_SCORES].sum(-1).numpy()
        if name in extras:
            return np.asarray(extras[name], dtype=float)
        if name in ("acc", "score"):
            return batch[K.TOKEN_LEVEL_SCORES].sum(-1).numpy()
        raise DynamicSamplingError(
            f"algorithm.filter_groups.metric={name}: the reward function returned no such key (it returned "
            f"{sorted(extras) or 'a plain number'}); use acc, score, seq_reward, seq_final_reward or one of those keys"
        )


def varied_groups(uids, values: np.ndarray) -> tuple[list[int], int]:
    """(rows of the groups whose `values` are not all equal, in batch order; number of groups).

    A group of one sample is kept (as verl does: there is nothing to compare it with).

    >>> varied_groups(["a", "a", "b", "b", "c"], np.array([1.0, 0.0, 1.0, 1.0, 0.0]))
    ([0, 1, 4], 3)
    """
    members: dict = {}
    for i, u in enumerate(uids):
        members.setdefault(u, []).append(i)
    rows = [i for idx in members.values() if len(idx) == 1 or np.std(values[idx]) > 0 for i in idx]
    return sorted(rows), len(members)


def concat_padded(batches: list[Batch]) -> Batch:
    """Batch.concat after padding every (B, L) tensor to the widest: prompts on the left, the rest on the right."""
    if len(batches) == 1:
        return batches[0]
    pad_id = batches[0].meta[K.PAD_TOKEN_ID]
    padded = []
    widths = [max(x[k].shape[1] for x in batches) for k in (K.PROMPTS, K.RESPONSES)]
    for b in batches:
        tensors = {}
        for key, t in b.tensors.items():
            if key == K.ROUTED_EXPERTS:  # (B, P + R, L, k): a mixture of experts' routing (router replay R3)
                tensors[key] = pad_sequence_layout(t, b[K.PROMPTS].shape[1], *widths, K.NO_EXPERT)
                continue
            width = max(x.tensors[key].shape[1] for x in batches) if t.dim() == 2 else 0
            extra = width - t.shape[1] if t.dim() == 2 else 0
            value = pad_id if key in (K.PROMPTS, K.RESPONSES) else 0
            if extra:
                t = F.pad(t, (extra, 0) if key in _LEFT_PADDED else (0, extra), value=value)
            tensors[key] = t
        padded.append(Batch(tensors, dict(b.non_tensors), dict(b.meta)))
    return Batch.concat(padded)


def prompts_of(batch: Batch, n: int) -> Batch:
    """The prompts of a batch of groups of `n` adjacent responses, one row each."""
    # RAW_CHAT (the chat messages a reward model re-renders) comes with prompts loaded from files
    fields = [*_PROMPT_FIELDS, *([K.RAW_CHAT] if K.RAW_CHAT in batch else [])]
    return batch.index(np.arange(0, len(batch), n)).select(fields)
