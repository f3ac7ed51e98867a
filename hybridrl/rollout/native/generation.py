"""`Generation`: one `generate` call of the native engine (engine.py describes the loop), kept
apart from the engine, which holds what outlives a call (the runner, its cache, the options)."""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rollout.base import Hooks, SamplingParams
from hybridrl.rollout.lengths import row_limits
from hybridrl.rollout.native.record import RunRecord
from hybridrl.rollout.native.routing import RouteHistory
from hybridrl.rollout.native.rows import RunningRows
from hybridrl.rollout.native.scheduler import Group, Scheduler
from hybridrl.rollout.native.turns import Turns


class Generation:
    """One `generate` call: the loop between the scheduler (queues, blocks) and the runner
    (forward passes), writing into the run record (record.py) and, multi-turn, the turns
    (turns.py). Each `step` is schedule -> run -> postprocess.

    Decode runs one step ahead of the host: step k is launched before the results of step k-1
    are read, so the host's bookkeeping overlaps the device's work. A sequence that ended on EOS
    at step k-1 therefore runs one wasted step k (its token is dropped)."""

    def __init__(self, engine, prompts: Batch, sampling: SamplingParams, hooks: Hooks, seeds):
        """`engine`: the NativeRolloutEngine (its runner, limits and options)."""
        self.engine, self.runner, self.prompts, self.n = engine, engine.runner, prompts, sampling.n
        n, max_new = sampling.n, sampling.max_new_tokens
        ids, mask = prompts[K.PROMPTS], prompts[K.PROMPT_MASK].bool()
        total = len(prompts) * n
        longest = int(mask.sum(1).max()) + max_new if len(prompts) else 0
        if n > engine.max_num_seqs:
            raise ValueError(
                f"rollout.n={n} exceeds rollout.max_num_seqs={engine.max_num_seqs}: the samples of a prompt run together"
            )
        if longest > engine.max_model_len:
            raise ValueError(
                f"a prompt plus {max_new} new tokens is {longest} tokens, over the engine's max_model_len={engine.max_model_len}"
            )
        if seeds is None:
            seeds = (torch.randint(0, 2**31 - 1, (1,)).item() + torch.arange(total) * 7919).tolist()
            if engine.tp is not None:  # the replica samples with its first rank's seeds
                t = torch.tensor(seeds, dtype=torch.long, device=engine.device)
                torch.distributed.broadcast(t, src=engine.tp.src, group=engine.tp.group)
                seeds = t.tolist()
        if len(seeds) != total:
            raise ValueError(f"seeds: need one per output sequence ({total}), got {len(seeds)}")
        engine.wake()
        self.max_new = max_new
        self.mode = (0.0 if sampling.greedy else float(sampling.temperature), sampling.top_k, sampling.top_p)
        self.sched = Scheduler(
            engine.cache.allocator, engine.block_size, engine.max_num_seqs, engine.max_num_batched_tokens, engine.prefix_caching
        )
        for i in range(len(prompts)):
            rows = list(range(i * n, (i + 1) * n))
            self.sched.add(Group(ids[i][mask[i]].tolist(), rows, [int(seeds[r]) for r in rows]))
        forced = row_limits(sampling, prompts)  # benchmarks: each row's exact length, EOS ignored
        if forced is not None and hooks.agent is not None:
            raise ValueError("rollout.forced_response_lengths is for single-turn rollouts, not multi-turn")
        eos = engine.eos_token_ids if not engine.ignore_eos and forced is None else []
        self.record = RunRecord(total, max_new, engine.pad_token_id, eos, engine.tokenizer, hooks, forced)
        self.rows = RunningRows(self.runner, self.sched, engine.max_num_seqs)
        self.routes = RouteHistory(total, longest, self.runner.routes.shape) if self.runner.routes is not None else None
        self.runner.route_history = self.routes
        self.runner.start_run()
        self.prefilling: deque = deque()  # [group, sequences, block copies, prompt tokens cached] of long prompts
        self.prefill_chunks = 0
        self.turns = None if hooks.agent is None else Turns(hooks.agent, self.record, self.runner, self.sched, prompts, n, engine)
        self.swap = hooks.weight_swap if hooks.agent is None else None
        self.stats = dict(steps=0, decode_s=0.0, peak_usage=0.0, max_gap_s=0.0)
        self.pending = None  # the launched decode step whose tokens are not read yet
        self.last_launch = None  # when the previous decode step was launched (the gaps: prefill passes, chunks)
        self.t0 = time.perf_counter()

    def step(self) -> bool:
        """One iteration; False once every sequence is done."""
        self.schedule()
        return self.postprocess(self.run())

    def schedule(self) -> None:
        """Before the next decode launch: new weights, resumed turns, admitted prompts' prefill."""
        if self.swap is not None and self.swap.ready():  # partial rollout: new weights from here on
            if self.pending is not None:
                self._collect(self.pending)
                self.pending = None
            self.record.swapped(self.swap.swap())
        if self.turns is not None:
            rejoin = self.turns.resume(self.mode, self.stats["steps"])
            if rejoin is not None:
                seqs, out_rows, tok, cached = rejoin
                self.rows.join(seqs, out_rows, tok, cached, self.record.lengths[out_rows])
        new = self.sched.schedule(self.max_new) if self.sched.waiting else []
        if new:
            self._prefill(new)
        if self.prefilling:
            self._prefill_chunk()

    def run(self):
        """Queue one decode step on the device (no sync). Rows that finished (known from the last
        results) or that will have max_new tokens once the steps in flight return leave first.
        Returns what `_collect` needs to read the step's tokens, or None when no row runs."""
        self.t_launch = time.perf_counter()
        self.stats["peak_usage"] = max(self.stats["peak_usage"], self.engine.cache.usage)
        B, rows, record = len(self.sched.running), self.rows, self.record
        out_row = rows.out_row[:B]
        B = rows.leave(
            record.done[out_row] | (rows.launched[:B] >= record.limit[out_row]), self.turns.pause if self.turns else None
        )
        if B == 0:
            return None
        rows.grow(B, self.engine.block_size)
        routed_at = rows.cached[:B].copy() if self.routes is not None else None  # the input tokens' positions
        host, event = self.runner.decode(B, self.mode)
        rows.advance(B, self.runner.decode_steps)
        routes = (self.runner.last_routes, routed_at) if self.routes is not None else None
        return list(self.sched.running), rows.out_row[:B].copy(), host, event, routes

    def postprocess(self, launched) -> bool:
        """Read the previous step's tokens (the device runs `launched` meanwhile); hand ended turns
        to the agent. Returns whether anything is left to do."""
        if self.pending is not None:
            self._collect(self.pending)
        stats, t = self.stats, self.t_launch
        if launched is not None:
            stats["decode_s"] += time.perf_counter() - t
            stats["steps"] += self.runner.decode_steps
            if self.last_launch is not None:
                stats["max_gap_s"] = max(stats["max_gap_s"], t - self.last_launch)
            self.last_launch = t
        self.pending = launched
        if self.turns is not None:
            self.turns.end_turns()
        if self.pending is None and self.sched.idle:
            if self.turns is None or not self.turns.waiting:
                return False
            self.turns.wait()
        return True

    def result(self) -> tuple[Batch, dict[str, float]]:
        """The output batch and the call's metrics."""
        elapsed = time.perf_counter() - self.t0
        out = self.record.assemble(self.prompts.repeat_interleave(self.n) if self.n > 1 else self.prompts)
        assemble_s = time.perf_counter() - self.t0 - elapsed
        new_tokens, stats, runner = float(out[K.RESPONSE_MASK].sum()), self.stats, self.runner
        metrics = {
            "rollout/kv_cache_usage": stats["peak_usage"],
            "perf/rollout_tokens_per_s": new_tokens / max(elapsed, 1e-9),
            "rollout/decode_steps": stats["steps"],
            "rollout/decode_ms_per_step": 1000 * stats["decode_s"] / max(stats["steps"], 1),
            "rollout/loop_s": elapsed,
            "rollout/assemble_s": assemble_s,
            # the longest wait between two decode launches: what a prefill pass between them held
            # running sequences up (chunked prefill bounds it by one chunk's pass)
            "rollout/max_launch_gap_ms": 1000 * stats["max_gap_s"],
        }
        if runner.use_graphs:  # captures happen on first use of a batch size, and after the cache moved
            metrics["rollout/graph_captures"] = float(runner.captures)
            metrics["rollout/graph_capture_s"] = runner.capture_s
        if self.engine.prefix_caching:
            metrics["rollout/prefix_cache_hit_rate"] = self.sched.hit_rate
        if self.engine.prefill_chunk:
            metrics["rollout/prefill_chunks"] = float(self.prefill_chunks)
        if self.routes is not None:
            real = out[K.RESPONSE_ATTENTION_MASK] if K.RESPONSE_ATTENTION_MASK in out else out[K.RESPONSE_MASK]
            out[K.ROUTED_EXPERTS] = self.routes.assemble(out[K.PROMPT_MASK], real)
        if self.turns is not None:
            out, agent_metrics = self.turns.finish(out, elapsed)
            metrics.update(agent_metrics)
        return out, metrics

    def _prefill(self, groups: list[Group]) -> None:
        """Prompt forward pass of the admitted groups, their first tokens, and their new rows.
        Groups that found their prompt's first blocks in the prefix cache compute only the rest
        (an extend pass over the cached blocks) after the others, whose blocks they may read. A
        group's blocks are offered to later prompts once nothing can read them before they are
        written: at once here (the writing pass runs first, and within one pass each layer writes,
        then reads), after the last chunk for a prompt prefilled in chunks."""
        sched, chunk, fresh, cached = self.sched, self.engine.prefill_chunk, [], []
        for g in groups:
            seqs, copies = sched.start_group(g, self.max_new)
            if chunk and len(g.prompt) - g.cached > chunk:
                self.prefilling.append([g, seqs, copies, g.cached])  # a chunk at a time, between decode steps
                sched.prefilling_rows += len(seqs)
                continue
            sched.register(g, seqs[0].blocks)
            (cached if g.cached else fresh).append((g, seqs, copies))
        for part in (fresh, cached):
            if not part:
                continue
            seqs = [s for _, group_seqs, _ in part for s in group_seqs]
            copies = [c for _, _, group_copies in part for c in group_copies]
            tables, samples = [group_seqs[0].blocks for _, group_seqs, _ in part], [len(g.out_rows) for g, _, _ in part]
            seeds = [s.seed for s in seqs]
            rows_of = self.route_rows([g.out_rows for g, _, _ in part])
            if part is fresh:
                tok, lp = self.runner.prefill(
                    [g.prompt for g, _, _ in part], tables, samples, copies, seeds, self.mode, **rows_of
                )
            else:
                tokens, starts = [g.prompt[g.cached :] for g, _, _ in part], [g.cached for g, _, _ in part]
                tok, lp = self.runner.extend(tokens, starts, tables, seeds, self.mode, samples, copies, **rows_of)
            self._start(seqs, tok, lp)

    def route_rows(self, rows: list[list[int]]) -> dict:
        """A prefill/extend pass's keyword for recording the routing (router replay R3): the
        output rows of each of its rows; nothing when the call does not record."""
        return {"route_rows": rows} if self.routes is not None else {}

    def _prefill_chunk(self) -> None:
        """The next chunk of the oldest long prompt being prefilled (an extend pass over the
        chunks before it); after its last chunk its samples sample their first tokens and start."""
        entry = self.prefilling[0]
        g, seqs, copies, done = entry
        end = min(len(g.prompt), done + self.engine.prefill_chunk)
        self.prefill_chunks += 1
        if end < len(g.prompt):
            rows_of = self.route_rows([g.out_rows])
            self.runner.extend([g.prompt[done:end]], [done], [seqs[0].blocks], [seqs[0].seed], self.mode, sample=False, **rows_of)
            entry[3] = end
            return
        self.prefilling.popleft()
        self.sched.prefilling_rows -= len(seqs)
        seeds, rows_of = [s.seed for s in seqs], self.route_rows([g.out_rows])
        tok, lp = self.runner.extend(
            [g.prompt[done:]], [done], [seqs[0].blocks], seeds, self.mode, [len(seqs)], copies, **rows_of
        )
        self.sched.register(g, seqs[0].blocks)
        self._start(seqs, tok, lp)

    def _start(self, seqs: list, tok: torch.Tensor, lp: torch.Tensor) -> None:
        """Record the first tokens of newly prefilled sequences; those not finished take rows."""
        out_rows = np.array([s.out_row for s in seqs])
        finished = self.record.record(out_rows, tok.cpu().numpy(), lp.cpu().numpy())
        ended = np.nonzero(finished)[0]
        if self.turns is None:
            self.sched.postprocess([seqs[j] for j in ended], [1] * len(ended))
            self.record.report(out_rows[ended])
        else:  # the turn ended on its first token: the sequence waits with its prompt cached
            for j in ended:
                self.turns.pause(seqs[j], seqs[j].prompt_len)
        keep = np.nonzero(~finished)[0]
        if len(keep):
            rows = [seqs[j] for j in keep]
            self.rows.join(rows, out_rows[keep], tok[torch.from_numpy(keep).to(tok.device)], [s.prompt_len for s in rows], 1)

    def _collect(self, launched) -> None:
        """Read a launched step's tokens: record them, finish the sequences that ended."""
        seqs, out_rows, host, event, routes = launched
        if event is not None:
            event.synchronize()
        B = len(seqs)
        live = np.nonzero(~self.record.done[out_rows])[0]  # rows that ended earlier ran wasted steps
        if routes is not None:  # every row: a finished row's wasted step ran its last token (a turn's EOS, cached)
            self.routes.store_decode(routes[0], out_rows, np.arange(B), routes[1])
        toks = host[0, :, :B].numpy().astype(np.int64).T[live]  # (rows, steps)
        lps = host[1, :, :B].numpy().T[live]
        ended = live[self.record.record_steps(out_rows[live], toks, lps)]
        if len(ended) and self.turns is None:
            rows = out_rows[ended]
            self.sched.postprocess([seqs[r] for r in ended], self.record.lengths[rows].tolist())
            self.record.report(rows, detokenize=True)  # the next step is already queued: the device does not wait
