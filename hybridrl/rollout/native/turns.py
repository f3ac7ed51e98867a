"""Multi-turn state of one native `generate` call (`Hooks(agent=...)`): pause, end of turn, resume.

A sequence whose turn ends (EOS or the turn's token limit) leaves the batch but keeps its KV
blocks (`pause`); once its last token is recorded the agent gets the turn (`end_turns`) and
answers, maybe later (tools run while others decode), with the tokens to append or None (the
trajectory is over). `resume` appends the answers, prefills them after the cached tokens in one
extend pass, and hands the sequences back to the loop to rejoin the batch.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.rollout.native.record import RunRecord
from hybridrl.rollout.native.runner import ModelRunner
from hybridrl.rollout.native.scheduler import Scheduler


class Turns:
    def __init__(self, agent, record: RunRecord, runner: ModelRunner, sched: Scheduler, prompts, n: int, engine):
        """`prompts`: the call's (PROMPTS, PROMPT_MASK) batch, each sampled `n` times; `engine`: the
        NativeRolloutEngine (its `max_num_seqs` and `resume_wait_steps`)."""
        self.agent, self.record, self.runner, self.sched = agent, record, runner, sched
        self.max_num_seqs, self.wait_steps = engine.max_num_seqs, engine.resume_wait_steps
        max_new = self.max_new = record.tok_hist.shape[1]
        ids, mask = prompts[K.PROMPTS], prompts[K.PROMPT_MASK].bool()
        total = len(prompts) * n
        self.prompt_of = [ids[i // n][mask[i // n]].numpy() for i in range(total)]
        agent.begin(prompts, n, max_new)
        record.limit[:] = [agent.turn_limit(row, 0) for row in range(total)]
        # per output row: where the current turn started, whether the row has left the batch and
        # the agent has its turn; paused sequences (holding their blocks) and ready answers
        self.turn_start = np.zeros(total, dtype=np.int64)
        self.left = np.zeros(total, dtype=bool)
        self.notified = np.zeros(total, dtype=bool)
        self.paused: dict[int, tuple] = {}  # out row -> (sequence, tokens cached)
        self.ready: deque = deque()  # (out row, tokens to append or None)
        self.ready_since: int | None = None  # decode steps run when the oldest ready answer came
        self.extend_passes, self.extend_rows, self.extend_s, self.tool_wait_s = 0, 0, 0.0, 0.0

    def pause(self, seq, cached: int) -> None:
        """`seq` left the batch at the end of a turn with `cached` tokens (prompt + response) in the cache."""
        self.left[seq.out_row] = True
        self.paused[seq.out_row] = (seq, cached)

    def end_turns(self) -> None:
        """Hand every turn that is over (the sequence left, its last token recorded) to the agent."""
        rec = self.record
        for row in np.nonzero(self.left & rec.done & ~self.notified)[0]:
            self.notified[row] = True
            turn = rec.tok_hist[row, self.turn_start[row] : rec.lengths[row]]
            self.agent.end_turn(int(row), turn.tolist(), bool(np.isin(turn[-1:], rec.eos).any()))
        self.ready.extend(self.agent.poll(block=False))

    @property
    def waiting(self) -> bool:
        """Some trajectory is not over: its sequence waits for an answer."""
        return bool(self.paused)

    def wait(self) -> None:
        """Every sequence waits for a tool or a user turn: block until an answer comes."""
        if not self.ready:
            t = time.perf_counter()
            self.ready.extend(self.agent.poll(block=True))
            self.tool_wait_s += time.perf_counter() - t

    def resume(self, mode, steps: int):
        """Apply the agent's answers: end trajectories, or append tokens and prefill them. Returns
        the sequences that rejoin the batch, as (sequences, output rows, their next input tokens
        on the device, tokens cached), or None. `steps`: decode steps run so far in this call
        (how long answers have waited)."""
        self.ready.extend(self.agent.poll(block=False))
        if not self.ready:
            return None
        if self.ready_since is None:
            self.ready_since = steps
        running = len(self.sched.running)
        # Rejoin together: each extend pass is an eager forward and a host sync, whatever its size.
        # Wait (a few decode steps at most) while others still decode and few answers are in.
        if running and len(self.ready) < max(1, running // 2) and steps - self.ready_since < self.wait_steps:
            return None
        rows, seqs, inputs, starts = self._take(self.max_num_seqs - running)
        self.ready_since = steps if self.ready else None
        if not rows:
            return None
        t, rec = time.perf_counter(), self.record
        out_rows = np.array(rows)
        self.turn_start[out_rows] = rec.lengths[out_rows]
        rec.limit[out_rows] = [self.agent.turn_limit(int(r), int(rec.lengths[r])) for r in rows]
        rec.done[out_rows] = self.left[out_rows] = self.notified[out_rows] = False
        rows_of = {"route_rows": [[r] for r in rows]} if self.runner.route_history is not None else {}
        tok, lp = self.runner.extend(inputs, starts, [s.blocks for s in seqs], [s.seed for s in seqs], mode, **rows_of)
        finished = rec.record(out_rows, tok.cpu().numpy(), lp.cpu().numpy())
        self.extend_passes, self.extend_rows = self.extend_passes + 1, self.extend_rows + len(rows)
        self.extend_s += time.perf_counter() - t
        cached = [s + len(x) for s, x in zip(starts, inputs)]
        for j in np.nonzero(finished)[0]:  # the turn ended on its first token
            self.pause(seqs[j], cached[j])
        keep = np.nonzero(~finished)[0]
        if len(keep) == 0:
            return None
        return [seqs[j] for j in keep], out_rows[keep], tok[torch.from_numpy(keep).to(tok.device)], [cached[j] for j in keep]

    def _take(self, budget: int):
        """Up to `budget` ready answers: the trajectories that end give their blocks back; the
        others get their tokens appended (and blocks for them). Returns (rows, sequences, the
        tokens to prefill, the tokens cached before them)."""
        rows, seqs, inputs, starts = [], [], [], []
        rec = self.record
        while self.ready and len(rows) < budget:
            row, tokens = self.ready.popleft()
            seq, cached = self.paused.pop(row)
            if tokens is None:
                self.sched.finish(seq)
                continue
            L, k = int(rec.lengths[row]), len(tokens)
            cached = min(cached, seq.prompt_len + L)  # a multi-step launch may have run past the turn's end
            if not tokens or L + k >= self.max_new:
                raise RuntimeError(f"agent: {k} appended tokens after {L} do not leave room for a model token in {self.max_new}")
            rec.append(row, tokens)
            while len(seq.blocks) * self.sched.block_size < seq.prompt_len + L + k:
                self.sched.grow(seq)
            full = np.concatenate([self.prompt_of[row], rec.tok_hist[row, : L + k]])
            rows.append(row)
            seqs.append(seq)
            inputs.append(full[cached:].tolist())
            starts.append(cached)
        return rows, seqs, inputs, starts

    def finish(self, out, elapsed: float) -> tuple:
        """The agent's finished batch and the call's multi-turn metrics."""
        out = self.agent.finish(out)
        metrics = dict(self.agent.metrics(elapsed, self.tool_wait_s))
        metrics["rollout/extend_passes"] = float(self.extend_passes)
        metrics["rollout/extend_rows_mean"] = self.extend_rows / max(self.extend_passes, 1)
        metrics["rollout/extend_s"] = self.extend_s
        return out, metrics
