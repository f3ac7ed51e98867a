"""Rollouts of one RL step: generate, and DAPO's dynamic sampling.

Without `algorithm.filter_groups.enable` a step generates `rollout.n` responses for its prompts,
once; the reward stage scores them (hybridrl/rewards/stage.py), while they decode when it streams.
With it (DAPO, Yu et al. 2025, arXiv 2503.14476, section 3.2) each round is scored at once, and a
prompt whose responses all got the same `filter_groups.metric` (all right or all wrong) is dropped:
its group-relative advantages would all be 0 and it would only shrink the gradient. The step then
draws `data.gen_batch_size` more prompts and generates again, until `data.train_batch_size`
prompts with varied outcomes are collected (the surplus is cut, whole groups at a time), or
gives up after `filter_groups.max_num_gen_batches` rounds.

Metrics: train/num_gen_batches (generation rounds this step, verl's name),
train/num_groups_generated and train/num_groups_kept; over every response generated this step, before
the filter: train/generated/score_mean, and the shares of groups without signal and all at the top
(train/generated/no_signal_frac, train/generated/all_top_frac; trainer/metrics.py's group_metrics).
The trained batch holds kept groups only, so its critic/groups/* are 0 by construction, and its
reward/* metrics are those of the last round (all of its responses).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch, pad_sequence_layout
from hybridrl.rewards.stage import EarlyScores, RewardStage, Scores
from hybridrl.tracking.progress import ticker
from hybridrl.tracking.timer import StageTimer
from hybridrl.trainer.metrics import group_metrics

_LEFT_PADDED = (K.PROMPTS, K.PROMPT_MASK)
_PROMPT_FIELDS = (K.PROMPTS, K.PROMPT_MASK, K.UID, K.DATA_SOURCE, K.GROUND_TRUTH, K.EXTRA_INFO, K.RAW_PROMPT)


class DynamicSamplingError(RuntimeError):
    """Too few prompts with varied outcomes within filter_groups.max_num_gen_batches rounds."""


class RolloutSampler:
    """generate -> [score, keep groups whose metric varies, repeat]."""

    def __init__(self, cfg, actor, reward: RewardStage, sampling, next_prompts: Callable[[], Batch]):
        """`reward`: the step's reward stage; with the actor in this process, a stream it gives
        scores each response as it ends (the engines that do not report them are scored after)."""
        self.cfg, self.actor, self.reward, self.sampling = cfg, actor, reward, sampling
        self.next_prompts = next_prompts
        self.filter = cfg.algorithm.filter_groups
        self.in_process = getattr(actor, "in_process", False)

    def sample(self, prompts: Batch, timer: StageTimer, generated=None) -> tuple[Batch, Batch, dict, EarlyScores]:
        """(responses, the prompts they answer, rollout metrics, the scoring done so far).
        `generated`: the responses to `prompts` submitted earlier (a rollout pool's pending
        generation, trainer/rollout_pool.py): waited for instead of generating."""
        if generated is not None or not self.filter.enable:
            batch, rollout_metrics, stream = self._round(prompts, timer, generated)
            return batch, prompts, rollout_metrics, EarlyScores(stream=stream)
        want, n = self.cfg.data.train_batch_size, self.sampling.n
        kept: list[tuple[Batch, Scores]] = []
        rounds = generated = groups_kept = 0
        seen_uids, seen_values, seen_scores = [], [], []  # every generated response: what the filter saw
        rollout_metrics = {}
        while True:
            rounds += 1
            batch, rollout_metrics, _ = self._round(prompts, timer)
            with timer("reward"):
                scores = self.reward.score(batch)
            batch[K.UID] = [f"{u}#g{rounds}" for u in batch[K.UID]]  # a prompt drawn twice stays two groups
            values = self._metric_values(scores)
            rows, groups = varied_groups(batch[K.UID], values)
            seen_uids += list(batch[K.UID])
            seen_values.append(values)
            seen_scores.append(scores.values)
            generated += groups
            groups_kept += len(rows) // n if len(rows) else 0
            if len(rows):
                kept.append((batch.index(rows), scores.take(rows)))
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
        batch = concat_padded([b for b, _ in kept]).index(slice(0, want * n))
        scores = Scores.concat([s for _, s in kept]).take(range(want * n))
        metrics = {
            **rollout_metrics,
            "train/num_gen_batches": rounds,
            "train/num_groups_generated": generated,
            "train/num_groups_kept": groups_kept,
            "train/generated/score_mean": float(torch.cat(seen_scores).double().mean()),
            **group_metrics(seen_uids, torch.as_tensor(np.concatenate(seen_values)), prefix="train/generated"),
        }
        return batch, prompts_of(batch, n), metrics, EarlyScores(scores=scores)

    @property
    def metric(self) -> str:
        return self.filter.metric or "acc"

    def _round(self, prompts: Batch, timer: StageTimer, generated=None):
        """One generation: (batch, rollout metrics, the stream scoring it as responses ended, or None)."""
        stream = self.reward.stream(prompts, self.sampling.n) if self.in_process and generated is None else None
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
        return batch, batch.meta.pop(K.ROLLOUT_METRICS, {}), stream

    def _metric_values(self, scores: Scores) -> np.ndarray:
        """One value of filter_groups.metric per response."""
        name = self.metric
        if name in ("seq_reward", "seq_final_reward"):  # no KL penalty yet at this point: both are the shaped score
            return scores.values.numpy()
        if name in scores.extras:
            return np.asarray(scores.extras[name], dtype=float)
        if name in ("acc", "score"):
            return scores.values.numpy()
        raise DynamicSamplingError(
            f"algorithm.filter_groups.metric={name}: the reward function returned no such key (it returned "
            f"{sorted(scores.extras) or 'a plain number'}); use acc, score, seq_reward, seq_final_reward or one of those keys"
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
