"""The running rows of one native `generate` call: the host's mirror of the runner's row buffers.

Row i of the device buffers is row i of `Scheduler.running`; here each row also has its output
row, the tokens it has in the KV cache (= the position of its next input token) and the tokens it
will have once every launched decode step has returned. Sequences `join` at the end, `leave`
(finished rows go and the rest are compacted, so the batch is never re-padded), and `grow` the
blocks the next launch writes into.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.rollout.native.runner import ModelRunner
from hybridrl.rollout.native.scheduler import Scheduler


class RunningRows:
    def __init__(self, runner: ModelRunner, sched: Scheduler, max_num_seqs: int):
        self.runner, self.sched = runner, sched
        self.out_row, self.cached, self.launched = (np.zeros(max_num_seqs, dtype=np.int64) for _ in range(3))

    def join(self, seqs: list, out_rows: np.ndarray, tok: torch.Tensor, cached, launched) -> None:
        """`seqs` take the next rows: `tok` their next input tokens (on the device), with `cached`
        tokens in the cache and `launched` tokens once the steps in flight return."""
        start = self.sched.run(seqs)
        r = slice(start, start + len(seqs))
        self.out_row[r], self.launched[r], self.cached[r] = out_rows, launched, cached
        self.runner.start_rows(r, tok, self.cached[r], [s.seed for s in seqs], [s.blocks for s in seqs])

    def leave(self, leave: np.ndarray, on_leave=None) -> int:
        """The rows where `leave` (B,) is set leave the batch, `on_leave(sequence, tokens cached)`
        told of each (multi-turn: the sequence keeps its blocks); returns the rows left."""
        B = len(leave)
        if not leave.any():
            return B
        if on_leave is not None:
            for r in np.nonzero(leave)[0]:
                on_leave(self.sched.running[r], int(self.cached[r]))
        keep = np.nonzero(~leave)[0]
        self.runner.keep_rows(keep, B)
        for arr in (self.out_row, self.cached, self.launched):
            arr[: len(keep)] = arr[keep]
        self.sched.keep_rows(keep)
        return len(keep)

    def grow(self, B: int, block_size: int) -> None:
        """Blocks for the positions the next launch writes."""
        running, sched = self.sched.running, self.sched
        N, bs = self.runner.decode_steps, block_size
        cached = self.cached[:B]
        if N == 1:
            need = np.nonzero(cached % bs == 0)[0]  # rows whose next cached token opens a block
            if len(need):
                self.runner.add_blocks(need, cached[need] // bs, [sched.grow(running[r]) for r in need])
            return
        # blocks for the next N positions, within each row's reservation (past it: scratch block 0);
        # a row holds at least ceil(cached / bs) blocks: only those whose next N positions cross into a new one look
        rows, cols, blocks = [], [], []
        for r in np.nonzero((cached + N + bs - 1) // bs > (cached + bs - 1) // bs)[0]:
            seq = running[r]
            while seq.reserved > 0 and len(seq.blocks) * bs < cached[r] + N:
                rows.append(r)
                cols.append(len(seq.blocks))
                blocks.append(sched.grow(seq))
        if rows:
            self.runner.add_blocks(np.array(rows), np.array(cols), blocks)

    def advance(self, B: int, steps: int) -> None:
        """The first `B` rows were launched for `steps` more tokens."""
        self.cached[:B] += steps
        self.launched[:B] += steps
