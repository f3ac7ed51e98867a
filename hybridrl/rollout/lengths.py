"""Forced response lengths: a benchmark workload whose responses have lengths drawn from a chosen
heavy-tailed distribution, whatever the model's weights (`rollout.forced_response_lengths`).

Speed of RL training depends on the lengths of the responses, not on their words: in a
synchronous step every GPU waits for the longest response, and the asynchronous modes earn
their keep on that wait. A random-weight model (the benchmarks' speed stand-in) rarely samples
EOS and a real small model answers GSM8K in a few hundred tokens, so neither shows the tail of a
reasoning model. With this option each response is generated to its drawn length exactly, EOS
ignored (an EOS id sampled mid-response is kept as an ordinary token; log-probs stay the
model's full-vocabulary ones), so the engines, the trainer and the log-prob passes see the
workload's token counts.

The default schedule, lognormal(median 350, sigma 1.0) cut at 4,096 tokens:
    p50 = 350, p90 = 1,261, p99 = 3,584 tokens, mean 564; 0.7% of the responses reach the cap.
Why this shape and these numbers:
- Response lengths in reasoning RL are heavy-tailed: a few very long responses dominate the
  generation time (Hu et al. 2025, "Taming the Long-Tail", arXiv 2511.16665), the tail that the
  asynchronous systems' gains come from (docs/async.md). A lognormal is the simplest such shape
  with a median and a tail width to set, and `max` adds the cap's point mass, as a real run's
  truncated responses (`response_length/clip_ratio`) do.
- Checked against this repository's GSM8K GRPO runs (Qwen2.5-0.5B-Instruct, cap 512; step 1 of
  benchmarks/results/gsm8k_grpo_run{1,2,3}_*.metrics.jsonl and issue39_2026-11-28/run{2,3}_*, in git at 9a3b502):
  their `response_length/mean` of 250-287 tokens and clip ratio of 3.7-5.9% at the 512 cap fit
  a lognormal of median 225-270 and sigma 0.39-0.53 (solved from the two numbers; those files hold
  per-step statistics, not per-response lengths). The default keeps that median's scale and
  doubles the width, for a model that reasons: its p99 lands near the 4,096 cap and a batch of
  1,024 responses (128 prompts x 8) holds ~7 at the cap, so a synchronous step decodes ~7x the
  mean length while most rows have finished.
Any other schedule: `median`, `sigma`, `max`, or a histogram of a real run's lengths
(`histogram: path.json` holding {"edges": [e0, ..., ek], "counts": [c1, ..., ck]}: lengths drawn
uniformly within a bin chosen by its count).

Determinism: the length of sample j of a prompt is a function of (seed, the prompt's uid, j) only.
The uid names the prompt's epoch and dataset index (data/dataset.py), so the same training step
draws the same lengths in every trainer.mode, on any number of GPUs and DP splits, and with a
rollout pool generating ahead.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

from hybridrl.data import keys as K

DISTRIBUTIONS = ("lognormal", "histogram")
KEY = "actor_rollout_ref.rollout.forced_response_lengths"


@dataclass(frozen=True)
class ForcedLengths:
    """A length distribution over [min_len, max_len] tokens and the seed of its draws."""

    distribution: str = "lognormal"
    median: float = 350.0  # lognormal: the median length (tokens)
    sigma: float = 1.0  # lognormal: standard deviation of log(length)
    min_len: int = 1
    max_len: int = 4096  # longer draws are cut here (the cap's point mass)
    seed: int = 0
    edges: tuple[float, ...] = ()  # histogram: bin edges, increasing (k + 1 values)
    counts: tuple[float, ...] = ()  # histogram: bin weights (k values)

    def __post_init__(self):
        problem = self.problem()
        if problem:
            raise ValueError(f"{KEY}: {problem}")

    def problem(self) -> str | None:
        """What makes this distribution unusable, or None."""
        if self.distribution not in DISTRIBUTIONS:
            return f"distribution={self.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}"
        if not 1 <= self.min_len <= self.max_len:
            return f"needs 1 <= min ({self.min_len}) <= max ({self.max_len})"
        if self.distribution == "lognormal":
            if not (math.isfinite(self.median) and self.median > 0):
                return f"median={self.median} must be a positive number of tokens, e.g. 350"
            if not (math.isfinite(self.sigma) and self.sigma >= 0):
                return f"sigma={self.sigma} must be >= 0 (the spread of log length; 1.0 is a reasoning model's tail)"
            return None
        e, c = np.asarray(self.edges, dtype=float), np.asarray(self.counts, dtype=float)
        if len(e) < 2 or len(c) != len(e) - 1:
            return f"histogram needs k + 1 edges for k counts (got {len(e)} edges, {len(c)} counts)"
        if not (np.all(np.isfinite(e)) and np.all(np.diff(e) > 0)):
            return "histogram edges must be finite and increasing"
        if not (np.all(np.isfinite(c)) and np.all(c >= 0) and c.sum() > 0):
            return "histogram counts must be >= 0 and not all 0"
        if e[0] < 0:
            return f"histogram edges start at {e[0]}: lengths are >= 0"
        return None

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Lengths at probabilities `u` in (0, 1): the inverse CDF, rounded, within [min_len, max_len]."""
        u = np.asarray(u, dtype=np.float64)
        if self.distribution == "lognormal":
            z = np.array([NormalDist().inv_cdf(float(p)) for p in u.ravel()]).reshape(u.shape)
            x = np.rint(self.median * np.exp(self.sigma * z))
        else:  # a bin [a, b) holds the lengths a .. b - 1, drawn uniformly; empty bins are skipped
            edges, counts = np.asarray(self.edges, dtype=float), np.asarray(self.counts, dtype=float)
            cdf = np.concatenate([[0.0], np.cumsum(counts) / counts.sum()])  # (k + 1,)
            x = np.floor(np.interp(u, cdf, edges))
        return np.clip(x, self.min_len, self.max_len).astype(np.int64)

    def draw(self, uids: Sequence[str], n: int) -> np.ndarray:
        """(len(uids) * n,) int64: the length of sample j of prompt i at [i * n + j] (the engines'
        output rows: a prompt's samples adjacent)."""
        return self.quantile(uniforms(self.seed, uids, n))


def uniforms(seed: int, uids: Sequence[str], n: int) -> np.ndarray:
    """(len(uids) * n,) float64 in (0, 1): one per (prompt uid, sample), from a hash of
    (seed, uid, sample) -- the same on every process and Python run (str hash() is salted)."""
    out = np.empty(len(uids) * n, dtype=np.float64)
    for i, uid in enumerate(uids):
        for j in range(n):
            h = hashlib.blake2b(f"{seed}/{uid}/{j}".encode(), digest_size=8).digest()
            out[i * n + j] = (int.from_bytes(h, "little") + 0.5) / 2.0**64  # never 0 or 1
    return out


def from_config(c: Any, max_response_length: int) -> ForcedLengths | None:
    """The `rollout.forced_response_lengths` section as a `ForcedLengths`; None when it is off
    (distribution null). `max` defaults to data.max_response_length and may not exceed it.
    Raises ValueError naming the key on a bad value (config/checks/rollout.py reports it)."""
    if c.distribution is None:
        return None
    cap = c.max if c.max is not None else max_response_length
    if cap > max_response_length:
        raise ValueError(
            f"{KEY}.max={cap} is over data.max_response_length={max_response_length}: raise data.max_response_length "
            f"to {cap} (the engines size their KV cache and buffers by it) or lower {KEY}.max"
        )
    edges = counts = ()
    if c.distribution == "histogram":
        if not c.histogram:
            raise ValueError(f"{KEY}.distribution=histogram needs {KEY}.histogram: a JSON file of edges and counts")
        edges, counts = read_histogram(c.histogram)
    elif c.histogram:
        raise ValueError(f"{KEY}.histogram is set but distribution={c.distribution}; use distribution=histogram")
    return ForcedLengths(c.distribution, float(c.median), float(c.sigma), int(c.min), int(cap), int(c.seed), edges, counts)


def read_histogram(path: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(edges, counts) of a histogram JSON file: {"edges": [...], "counts": [...]}."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{KEY}.histogram={path}: no such file")
    try:
        data = json.loads(p.read_text())
        return tuple(float(x) for x in data["edges"]), tuple(float(x) for x in data["counts"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f'{KEY}.histogram={path}: want {{"edges": [e0, ..., ek], "counts": [c1, ..., ck]}} ({e})') from None


def row_limits(sampling, prompts) -> np.ndarray | None:
    """What an engine generates for one call of `sampling` (a `SamplingParams`) on `prompts` (a
    `Batch` with their UIDs): each output row's exact length, (len(prompts) * n,) int64; None
    for ordinary generation (EOS or max_new_tokens ends a response)."""
    forced = sampling.forced_lengths
    if forced is None:
        return None
    if forced.max_len > sampling.max_new_tokens:
        raise ValueError(f"{KEY}.max={forced.max_len} is over this generation's max_new_tokens={sampling.max_new_tokens}")
    if K.UID not in prompts:
        raise ValueError(
            f"{KEY}: the prompts need their uids ({K.UID!r}: the key of each row's length; collate_prompts sets them)"
        )
    return forced.draw([str(u) for u in prompts[K.UID]], sampling.n)
