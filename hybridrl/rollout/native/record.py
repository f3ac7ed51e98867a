"""The run record: the host's copy of every output row of one native `generate` call.

The engine's loop writes each step's tokens here (`record`, `record_steps`), reports finished
rows (`report`: the caller's `on_finish`, or their text detokenized while the device runs the
next step), notes weight swaps (`swapped`), and at the end `assemble`s the output batch. State is
numpy arrays, so a step's bookkeeping is a few vector operations rather than a loop over rows.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch


class RunRecord:
    def __init__(self, total: int, max_new: int, pad_token_id: int, eos_ids: list[int], tokenizer, hooks, limits=None):
        """`total` output rows of at most `max_new` tokens (`limits`: of each row's own number, (total,));
        `hooks`: the call's `Hooks` (on_finish, weight_swap: token versions, agent: tokens written by
        the environment)."""
        self.tokenizer, self.on_finish = tokenizer, hooks.on_finish if hooks.agent is None else None
        self.tok_hist = np.full((total, max_new), pad_token_id, dtype=np.int64)  # (rows, max_new)
        self.lp_hist = np.zeros((total, max_new), dtype=np.float32)  # (rows, max_new)
        # per output row: response length that ends its turn
        self.limit = np.full(total, max_new, dtype=np.int64) if limits is None else np.asarray(limits, dtype=np.int64)
        self.lengths = np.zeros(total, dtype=np.int64)  # tokens recorded per output row
        self.done = np.zeros(total, dtype=bool)  # per output row
        # RESPONSE_TEXT of the rows that ended, detokenized in the decode loop while the device runs
        # the next step (single-turn without on_finish; the rest are detokenized by `assemble`)
        self.texts: list[str | None] = [None] * total
        self.eos = np.array(eos_ids, dtype=np.int64)
        # multi-turn: which response tokens the environment (tools, users) wrote
        self.env_hist = np.zeros((total, max_new), dtype=bool) if hooks.agent is not None else None
        # partial rollouts: the version the call began with, and (version, tokens per row) at each swap
        swap = hooks.weight_swap if hooks.agent is None else None
        self.start_version = swap.version if swap is not None else None
        self.switches: list[tuple[int, np.ndarray]] = []

    def record(self, out_rows: np.ndarray, toks: np.ndarray, lps: np.ndarray) -> np.ndarray:
        """Store one new token for each of `out_rows`; returns which of them are now finished."""
        gen = self.lengths[out_rows]
        self.tok_hist[out_rows, gen] = toks
        self.lp_hist[out_rows, gen] = lps
        self.lengths[out_rows] = gen + 1
        finished = (gen + 1 >= self.limit[out_rows]) | np.isin(toks, self.eos)
        self.done[out_rows[finished]] = True
        return finished

    def record_steps(self, out_rows: np.ndarray, toks: np.ndarray, lps: np.ndarray) -> np.ndarray:
        """Store the tokens of one launch, (rows, steps), for `out_rows`: each row's up to and
        including its first EOS and within its limit (the rest were wasted steps); returns which
        rows are now finished. With one step per launch this is `record`."""
        if toks.shape[1] == 1:
            return self.record(out_rows, toks[:, 0], lps[:, 0])
        N = toks.shape[1]
        gen, limit = self.lengths[out_rows], self.limit[out_rows]
        is_eos = np.isin(toks, self.eos)
        any_eos = is_eos.any(1)
        first = np.where(any_eos, is_eos.argmax(1) + 1, N)  # tokens up to the first EOS
        keep = np.minimum(first, limit - gen)
        m = np.arange(N)[None, :] < keep[:, None]
        rows = np.repeat(out_rows, keep)
        cols = (gen[:, None] + np.arange(N)[None, :])[m]
        self.tok_hist[rows, cols] = toks[m]
        self.lp_hist[rows, cols] = lps[m]
        self.lengths[out_rows] = gen + keep
        finished = (any_eos & (first <= keep)) | (gen + keep >= limit)
        self.done[out_rows[finished]] = True
        return finished

    def append(self, row: int, tokens: list[int]) -> None:
        """Multi-turn: the environment's `tokens` (a tool or user message) after the row's own."""
        L, k = int(self.lengths[row]), len(tokens)
        self.tok_hist[row, L : L + k] = tokens
        self.env_hist[row, L : L + k] = True
        self.lengths[row] = L + k

    def report(self, rows: np.ndarray, detokenize: bool = False) -> None:
        """Finished output rows: handed with their tokens to `on_finish`, if the caller gave one;
        else, with `detokenize`, their text decoded now (the next step is already queued)."""
        if self.on_finish is not None:
            if len(rows):
                self.on_finish(rows.copy(), [self.tok_hist[r, : self.lengths[r]].copy() for r in rows])
        elif detokenize:  # (a streaming caller decodes the texts in its own thread)
            out = rows.tolist()
            for r, text in zip(out, self.detokenize(out)):
                self.texts[r] = text

    def detokenize(self, rows: list[int]) -> list[str]:
        """RESPONSE_TEXT of these output rows, from their tokens so far."""
        return self.tokenizer.batch_decode([self.tok_hist[r, : self.lengths[r]] for r in rows], skip_special_tokens=True)

    def swapped(self, version: int) -> None:
        """New weights (`version`) sample every token from here on."""
        self.switches.append((version, self.lengths.copy()))

    def assemble(self, batch: Batch) -> Batch:
        """`batch` (the prompts, repeated n times) with the responses, their masks and log-probs,
        their texts and (partial rollouts) ROLLOUT_TOKEN_VERSION."""
        width = int(self.lengths.max())
        responses = torch.from_numpy(self.tok_hist[:, :width].copy())  # (B, T)
        lengths = torch.from_numpy(self.lengths)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # (B, T) through the first EOS
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        batch[K.RESPONSES] = responses
        batch[K.RESPONSE_MASK] = mask
        if self.env_hist is not None:  # the model's tokens only; the tools' and users' are context
            batch[K.RESPONSE_ATTENTION_MASK] = mask
            mask = mask * torch.from_numpy(~self.env_hist[:, :width]).float()
            batch[K.RESPONSE_MASK] = mask
        batch[K.ROLLOUT_LOG_PROBS] = torch.from_numpy(self.lp_hist[:, :width].copy()) * mask
        texts = list(self.texts)
        todo = [r for r, t in enumerate(texts) if t is None]  # rows the decode loop did not detokenize
        for r, text in zip(todo, self.detokenize(todo) if todo else []):
            texts[r] = text
        batch[K.RESPONSE_TEXT] = texts
        if self.start_version is not None:
            batch[K.ROLLOUT_TOKEN_VERSION] = token_versions(self.start_version, self.switches, responses.shape)
        return batch


def token_versions(start: int, switches: list[tuple[int, np.ndarray]], shape) -> torch.Tensor:
    """(B, T) int64: the weights version that sampled each response token. `start` is the version
    the call began with; `switches` are the (version, tokens recorded per row at the swap) of its
    swaps, in order.

    >>> token_versions(1, [(2, np.array([1, 0])), (3, np.array([2, 1]))], (2, 4)).tolist()
    [[1, 2, 3, 3], [2, 3, 3, 3]]
    """
    B, T = shape
    out = torch.full((B, T), start, dtype=torch.long)
    cols = torch.arange(T)[None, :]
    for version, lengths in switches:
        out[cols >= torch.from_numpy(lengths[:B])[:, None]] = version
    return out
