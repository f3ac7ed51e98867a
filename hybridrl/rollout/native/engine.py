"""The native rollout engine: paged KV cache, continuous batching, CUDA-graph decode.

One `generate` call:
1. every prompt (left padding stripped) becomes a group of `n` samples waiting for admission;
2. each iteration admits the groups that fit (rows, KV blocks, prefill token budget), prefills
   them right-padded in one forward pass (their K/V go straight into the paged cache), samples
   each sample's first token, and forks the samples onto the prompt's shared blocks;
3. one decode step then runs every running sequence: a single token each, attending over its
   blocks; finished sequences leave and the remaining rows are compacted, so the batch is never
   re-padded and waiting prompts join as soon as blocks free up.

Three parts: the scheduler (scheduler.py) owns the queues and the blocks; the model runner
(runner.py) owns the model, the cache, the device row buffers and the forward passes (CUDA
graphs); this engine is the loop between them and the host record of every output row. Per
step the host only appends the new block ids that sequences crossed into and compacts rows
when some finish.

Tensor parallelism (`tp`, see tp.py): each rank of a replica runs this same loop on the same
prompts with the same seeds (drawn on the replica's first rank and broadcast); the runner's
collectives keep the ranks' tokens identical, so their schedules never diverge.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable
from typing import Sequence as Seq

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.base import eos_token_ids as default_eos_ids
from hybridrl.rollout.native.cache import KVCache
from hybridrl.rollout.native.runner import ModelRunner, canonical_name
from hybridrl.rollout.native.scheduler import Group, Scheduler
from hybridrl.rollout.native.tp import TensorParallel

__all__ = ["BLOCK_SIZE", "NativeRolloutEngine", "canonical_name"]

BLOCK_SIZE = 16
DECODE_STEPS_CUDA = 1  # decode steps per launch on CUDA: 8 measured no faster on an H200 host (BENCHMARKS.md)


RESUME_WAIT_STEPS = 16  # see NativeRolloutEngine(resume_wait_steps=)


class NativeRolloutEngine:
    def __init__(
        self,
        hf_config,
        tokenizer,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        max_model_len: int = 2048,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = False,
        block_size: int = BLOCK_SIZE,
        num_blocks: int | None = None,
        ignore_eos: bool = False,
        eos_token_ids: list[int] | None = None,
        tp: TensorParallel | None = None,
        decode_steps_per_sync: int | None = None,
        resume_wait_steps: int = RESUME_WAIT_STEPS,
        prefix_caching: bool = False,
        chunked_prefill: bool = False,
    ):
        """`tp`: this rank's tensor-parallel group (None or size 1: the whole model on this device).
        `decode_steps_per_sync`: decode steps launched together (one CUDA graph replay) before the
        host reads their tokens; None = DECODE_STEPS_CUDA on CUDA, 1 on CPU.
        `resume_wait_steps` (multi-turn): sequences whose tool or user turn has answered wait up to
        this many decode steps to rejoin the batch together (one extend pass over their appended
        tokens instead of one per answer); 0 = each rejoins as soon as its answer arrives.
        `prefix_caching`: prompts that start with the same full KV blocks as a prompt already in
        the cache (a shared system prompt) share those blocks and compute only the rest, within
        one generate call (scheduler.py); single-device engines only (ignored with `tp`).
        `chunked_prefill`: a prompt longer than `max_num_batched_tokens` is prefilled in chunks of
        that many tokens, one chunk between decode steps, so running sequences go on decoding
        (single-device engines only)."""
        device = torch.device(device)
        self.tokenizer = tokenizer
        # from_hf_model passes the HF engine's set (config + generation config + tokenizer)
        self.eos_token_ids = eos_token_ids or default_eos_ids(hf_config, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.max_num_batched_tokens, self.block_size, self.ignore_eos = max_num_batched_tokens, block_size, ignore_eos
        self.runner = ModelRunner(
            hf_config,
            device=device,
            dtype=dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32),
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            block_size=block_size,
            num_blocks=num_blocks,
            tp=tp,
            decode_steps=decode_steps_per_sync
            if decode_steps_per_sync is not None
            else (DECODE_STEPS_CUDA if device.type == "cuda" else 1),
            vocab_limit=len(tokenizer),
        )
        self.resume_wait_steps = resume_wait_steps
        self.prefix_caching = prefix_caching and (tp is None or tp.size == 1)
        self.prefill_chunk = max_num_batched_tokens if chunked_prefill and (tp is None or tp.size == 1) else None
        self.last_metrics: dict[str, float] = {}
        self.on_finish = None  # the current generate call's per-sequence report

    @classmethod
    def from_hf_model(
        cls, model, tokenizer, *, share_weights: bool = True, named_weights=None, **kwargs
    ) -> "NativeRolloutEngine":
        """An engine with `model`'s weights: aliased (zero copy) when device and dtype are the same
        and `share_weights`, copied otherwise; or copied from `named_weights` when given (full
        tensors; a tensor-parallel engine keeps its slices)."""
        engine = cls(model.config, tokenizer, eos_token_ids=default_eos_ids(model, tokenizer), **kwargs)
        first = next(model.parameters())
        if named_weights is not None:
            engine.load_weights(named_weights)
        elif engine.tp is not None:
            engine.load_weights(model.named_parameters())
        elif share_weights and first.device == engine.device and first.dtype == engine.dtype:
            engine.runner.alias_weights(model)
        else:
            engine.load_weights(model.named_parameters())
        return engine

    # -- what callers read of the runner (RolloutEngine.model; tests and benchmarks the rest) -----
    @property
    def model(self) -> torch.nn.Module:
        """The module the engine generates with (the native decoder; its parameters may alias
        the trainer's)."""
        return self.runner.model

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def tp(self) -> TensorParallel | None:
        """The tensor-parallel group (None at TP=1)."""
        return self.runner.tp

    @property
    def hf_config(self):
        return self.runner.hf_config

    @property
    def cache(self) -> KVCache | None:
        return self.runner.cache

    @property
    def graphs(self) -> dict:
        return self.runner.graphs

    @property
    def use_graphs(self) -> bool:
        return self.runner.use_graphs

    @use_graphs.setter
    def use_graphs(self, on: bool) -> None:  # benchmarks/rollout.py --profile compares both
        self.runner.use_graphs = on

    # -- RolloutEngine -------------------------------------------------------------------------
    def alias_weights(self, model) -> None:
        """See `ModelRunner.alias_weights`: the engine then reads the trainer's tensors."""
        self.runner.alias_weights(model)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], sharded: bool = False) -> None:
        """Copy weights in one tensor at a time (converting dtype/device on the way); tensors the
        engine already aliases are skipped. Names the engine does not have raise.

        `named_tensors`: (HF name, tensor) pairs, any subset of the model's parameters, in any order.
        With tensor parallelism, `sharded=False` (the default): full tensors, of which this rank
        keeps its slice; `sharded=True`: each tensor is already this rank's piece, i.e. equals
        `hybridrl.models.tp_shards.shard(name, full, hf_config, tp.rank, tp.size)` (the
        resharder's path: no rank ever holds a full tensor). At TP=1 both are the same."""
        self.runner.load_weights(named_tensors, sharded=sharded)

    def wake(self) -> None:
        """Allocate the KV cache (CUDA graphs are kept when it lands at the same address)."""
        self.runner.wake()

    def sleep(self) -> None:
        """Free the KV cache (the trainer gets the memory); weights and row buffers stay."""
        self.runner.sleep()

    # -- generation ----------------------------------------------------------------------------
    streams_finished = True  # generate(on_finish=...) reports each sequence as it ends
    swaps_weights = True  # generate(weight_swap=...) takes new weights between decode steps (partial rollouts)

    @torch.no_grad()
    def generate(
        self,
        prompts: Batch,
        sampling: SamplingParams,
        seeds: Seq[int] | None = None,
        agent=None,
        on_finish=None,
        weight_swap=None,
    ) -> Batch:
        """PROMPTS/PROMPT_MASK (left-padded) -> the batch x n with RESPONSES, RESPONSE_MASK,
        ROLLOUT_LOG_PROBS, RESPONSE_TEXT. `seeds` gives each output sequence its seed; by default
        they are drawn from torch's global generator (so torch.manual_seed reproduces a call).

        `on_finish(rows, tokens)`: called from the decode loop whenever sequences end, with their
        output rows (int array) and each one's response tokens (a list of int64 arrays, copies),
        so that a caller can score them while the others decode (trainer/stream_scoring.py). It
        must only hand them on: the loop waits for it. Not with `agent` (a turn is not the end).

        `agent` (a `hybridrl.rollout.agent.loop.AgentSession`): multi-turn. A sequence whose turn
        ends (EOS or the turn's token limit) leaves the batch but keeps its KV blocks; the agent
        gets the turn's tokens and answers, maybe later (tools run while others decode), with the
        tokens to append (a tool or user message and the next assistant header) or None (the
        trajectory is over). Appended tokens are prefilled after the cached ones and the sequence
        rejoins the batch. RESPONSES then hold every token after the prompt, RESPONSE_MASK only
        the model's, RESPONSE_ATTENTION_MASK all of them; `max_new_tokens` bounds the total.

        `weight_swap` (partial rollouts, single-turn): an object with `version` (int, the weights'
        now), `ready()` (new weights wait) and `swap()` (load them into this engine; returns their
        version). Between two decode launches where `ready()`, the step in flight is read first,
        then `swap()` loads the new weights in place and decoding goes on with them: the tokens
        sampled so far stay, and so do their KV blocks (computed by the older weights).
        ROLLOUT_TOKEN_VERSION (B, T) then says which weights sampled each token; the recorded
        log-probs are those of the distribution each token was drawn from."""
        n, max_new = sampling.n, sampling.max_new_tokens
        ids, mask = prompts[K.PROMPTS], prompts[K.PROMPT_MASK].bool()
        total = len(prompts) * n
        if n > self.max_num_seqs:
            raise ValueError(
                f"rollout.n={n} exceeds rollout.max_num_seqs={self.max_num_seqs}: the samples of a prompt run together"
            )
        longest = int(mask.sum(1).max()) + max_new if len(prompts) else 0
        if longest > self.max_model_len:
            raise ValueError(
                f"a prompt plus {max_new} new tokens is {longest} tokens, over the engine's max_model_len={self.max_model_len}"
            )
        if seeds is None:
            seeds = (torch.randint(0, 2**31 - 1, (1,)).item() + torch.arange(total) * 7919).tolist()
            if self.tp is not None:  # the replica samples with its first rank's seeds
                seeds = self._replica_seeds(seeds)
        if len(seeds) != total:
            raise ValueError(f"seeds: need one per output sequence ({total}), got {len(seeds)}")
        self.wake()
        mode = (0.0 if sampling.greedy else float(sampling.temperature), sampling.top_k, sampling.top_p)
        sched = Scheduler(
            self.cache.allocator, self.block_size, self.max_num_seqs, self.max_num_batched_tokens, self.prefix_caching
        )
        for i in range(len(prompts)):
            rows = list(range(i * n, (i + 1) * n))
            sched.add(Group(ids[i][mask[i]].tolist(), rows, [int(seeds[r]) for r in rows]))
        self._start_run(total, max_new, agent)
        self.on_finish = on_finish if agent is None else None
        if agent is not None:
            self.prompt_of = [ids[i // n][mask[i // n]].numpy() for i in range(total)]
            agent.begin(prompts, n, max_new)
            self.limit[:] = [agent.turn_limit(row, 0) for row in range(total)]
        stats = dict(steps=0, decode_s=0.0, peak_usage=0.0, tool_wait_s=0.0, max_gap_s=0.0)
        last_launch = None  # when the previous decode step was launched (the gaps: prefill passes, chunks)
        swap = weight_swap if agent is None else None
        start_version = swap.version if swap is not None else 0
        switches = []  # (version, tokens recorded per row when it was loaded)
        t0 = time.perf_counter()
        # Decode runs one step ahead of the host: step k is launched before the results of step
        # k-1 are read, so the host's bookkeeping overlaps the GPU's work. A sequence that ended
        # on EOS at step k-1 therefore runs one wasted step k (its token is dropped).
        pending = None
        while True:
            if swap is not None and swap.ready():  # partial rollout: new weights from here on
                if pending is not None:
                    self._collect(pending, sched, max_new)
                    pending = None
                switches.append((swap.swap(), self.lengths.copy()))
            if agent is not None:
                self._resume(sched, mode, max_new, stats["steps"])
            new = sched.schedule(max_new) if sched.waiting else []
            if new:
                self._prefill(sched, new, mode, max_new)
            if self.prefilling:
                self._prefill_chunk(sched, mode, max_new)
            t = time.perf_counter()
            stats["peak_usage"] = max(stats["peak_usage"], self.cache.usage)
            launched = self._launch_step(sched, mode, max_new)
            if pending is not None:
                self._collect(pending, sched, max_new)
            if launched is not None:
                stats["decode_s"] += time.perf_counter() - t
                stats["steps"] += self.runner.decode_steps
                if last_launch is not None:
                    stats["max_gap_s"] = max(stats["max_gap_s"], t - last_launch)
                last_launch = t
            pending = launched
            if agent is not None:
                self._end_turns()
            if pending is None and sched.idle:
                if agent is None or not self.paused:
                    break
                if not self.ready:  # every sequence waits for a tool or a user turn
                    t = time.perf_counter()
                    self.ready.extend(agent.poll(block=True))
                    stats["tool_wait_s"] += time.perf_counter() - t
        elapsed = time.perf_counter() - t0
        out = self._assemble(prompts.repeat_interleave(n) if n > 1 else prompts)
        assemble_s = time.perf_counter() - t0 - elapsed
        if weight_swap is not None and agent is None:
            out[K.ROLLOUT_TOKEN_VERSION] = token_versions(start_version, switches, out[K.RESPONSES].shape)
        new_tokens = float(out[K.RESPONSE_MASK].sum())
        self.last_metrics = {
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
        if self.runner.use_graphs:  # captures happen on first use of a batch size, and after the cache moved
            self.last_metrics["rollout/graph_captures"] = float(self.runner.captures)
            self.last_metrics["rollout/graph_capture_s"] = self.runner.capture_s
        if self.prefix_caching:
            self.last_metrics["rollout/prefix_cache_hit_rate"] = sched.hit_rate
        if self.prefill_chunk:
            self.last_metrics["rollout/prefill_chunks"] = float(self.prefill_chunks)
        if agent is not None:
            out = agent.finish(out)
            self.last_metrics.update(agent.metrics(elapsed, stats["tool_wait_s"]))
            self.last_metrics["rollout/extend_passes"] = float(self.extend_passes)
            self.last_metrics["rollout/extend_rows_mean"] = self.extend_rows / max(self.extend_passes, 1)
            self.last_metrics["rollout/extend_s"] = self.extend_s
            self.agent = None
        self.on_finish = None
        return out

    def _replica_seeds(self, seeds: list[int]) -> list[int]:
        t = torch.tensor(seeds, dtype=torch.long, device=self.device)
        torch.distributed.broadcast(t, src=self.tp.src, group=self.tp.group)
        return t.tolist()

    # Host state of one generate call, as numpy arrays so a step's bookkeeping is a few vector
    # operations rather than a Python loop over the batch: every output row's tokens and
    # log-probs so far, and per running row its output row, tokens generated and tokens cached.
    def _start_run(self, total: int, max_new: int, agent=None) -> None:
        self.tok_hist = np.full((total, max_new), self.pad_token_id, dtype=np.int64)
        self.limit = np.full(total, max_new, dtype=np.int64)  # per output row: response length that ends its turn
        self.lp_hist = np.zeros((total, max_new), dtype=np.float32)
        self.lengths = np.zeros(total, dtype=np.int64)  # tokens recorded per output row
        self.done = np.zeros(total, dtype=bool)  # per output row
        # RESPONSE_TEXT of the rows that ended, detokenized in the decode loop while the device runs
        # the next step (single-turn without on_finish; the rest are detokenized by _assemble)
        self.texts: list[str | None] = [None] * total
        S = self.max_num_seqs
        # per running row: output row, tokens cached (= position of its next input token), and
        # tokens it will have once every launched step has returned
        self.run_out_row, self.run_cached, self.run_launched = (np.zeros(S, dtype=np.int64) for _ in range(3))
        self.eos_np = np.array(self.eos_token_ids if not self.ignore_eos else [], dtype=np.int64)
        self.runner.start_run()
        self.prefilling: deque = deque()  # [group, sequences, block copies, prompt tokens cached] of long prompts
        self.prefill_chunks = 0
        # Multi-turn (agent) state per output row: which response tokens the environment wrote,
        # where the current turn started, whether the row has left the batch and how many of its
        # tokens are cached then; paused sequences (holding their blocks) and ready continuations.
        self.agent = agent
        if agent is not None:
            self.env_hist = np.zeros((total, max_new), dtype=bool)
            self.turn_start = np.zeros(total, dtype=np.int64)
            self.left = np.zeros(total, dtype=bool)
            self.notified = np.zeros(total, dtype=bool)
            self.paused: dict[int, tuple] = {}  # out row -> (sequence, tokens cached)
            self.ready: deque = deque()  # (out row, tokens to append or None)
            self.ready_since: int | None = None  # decode steps run when the oldest ready answer came
            self.extend_passes, self.extend_rows, self.extend_s = 0, 0, 0.0

    def _record(self, out_rows: np.ndarray, toks: np.ndarray, lps: np.ndarray, max_new: int) -> np.ndarray:
        """Store one new token for each of `out_rows`; returns which of them are now finished."""
        gen = self.lengths[out_rows]
        self.tok_hist[out_rows, gen] = toks
        self.lp_hist[out_rows, gen] = lps
        self.lengths[out_rows] = gen + 1
        finished = (gen + 1 >= self.limit[out_rows]) | np.isin(toks, self.eos_np)
        self.done[out_rows[finished]] = True
        return finished

    def _record_steps(self, out_rows: np.ndarray, toks: np.ndarray, lps: np.ndarray) -> np.ndarray:
        """Store the tokens of one launch, (rows, steps), for `out_rows`: each row's up to and
        including its first EOS and within its limit (the rest were wasted steps); returns which
        rows are now finished. With one step per launch this is `_record`."""
        if toks.shape[1] == 1:
            return self._record(out_rows, toks[:, 0], lps[:, 0], 0)
        N = toks.shape[1]
        gen, limit = self.lengths[out_rows], self.limit[out_rows]
        is_eos = np.isin(toks, self.eos_np)
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

    def _prefill(self, sched: Scheduler, groups: list[Group], mode, max_new: int) -> None:
        """Prompt forward pass of the admitted groups, their first tokens, and their new rows.
        Groups that found their prompt's first blocks in the prefix cache compute only the rest
        (an extend pass over the cached blocks) after the others, whose blocks they may read. A
        group's blocks are offered to later prompts once nothing can read them before they are
        written: at once here (the writing pass runs first, and within one pass each layer writes,
        then reads), after the last chunk for a prompt prefilled in chunks."""
        fresh, cached = [], []
        for g in groups:
            seqs, copies = sched.start_group(g, max_new)
            if self.prefill_chunk and len(g.prompt) - g.cached > self.prefill_chunk:
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
            if part is fresh:
                tok, lp = self.runner.prefill([g.prompt for g, _, _ in part], tables, samples, copies, seeds, mode)
            else:
                tokens, starts = [g.prompt[g.cached :] for g, _, _ in part], [g.cached for g, _, _ in part]
                tok, lp = self.runner.extend(tokens, starts, tables, seeds, mode, samples, copies)
            self._start_sequences(sched, seqs, tok, lp, max_new)

    def _prefill_chunk(self, sched: Scheduler, mode, max_new: int) -> None:
        """The next chunk of the oldest long prompt being prefilled (an extend pass over the
        chunks before it); after its last chunk its samples sample their first tokens and start."""
        entry = self.prefilling[0]
        g, seqs, copies, done = entry
        end = min(len(g.prompt), done + self.prefill_chunk)
        self.prefill_chunks += 1
        if end < len(g.prompt):
            self.runner.extend([g.prompt[done:end]], [done], [seqs[0].blocks], [seqs[0].seed], mode, sample=False)
            entry[3] = end
            return
        self.prefilling.popleft()
        sched.prefilling_rows -= len(seqs)
        tok, lp = self.runner.extend(
            [g.prompt[done:]], [done], [seqs[0].blocks], [s.seed for s in seqs], mode, [len(seqs)], copies
        )
        sched.register(g, seqs[0].blocks)
        self._start_sequences(sched, seqs, tok, lp, max_new)

    def _start_sequences(self, sched: Scheduler, seqs: list, tok: torch.Tensor, lp: torch.Tensor, max_new: int) -> None:
        """Record the first tokens of newly prefilled sequences; those not finished take rows."""
        toks, lps = tok.cpu().numpy(), lp.cpu().numpy()
        out_rows = np.array([s.out_row for s in seqs])
        finished = self._record(out_rows, toks, lps, max_new)
        ended = np.nonzero(finished)[0]
        if self.agent is None:
            sched.postprocess([seqs[j] for j in ended], [1] * len(ended))
            self._report(out_rows[ended])
        else:  # the turn ended on its first token: the sequence waits with its prompt cached
            for j in ended:
                self._pause(seqs[j], seqs[j].prompt_len)
        keep = np.nonzero(~finished)[0]
        if len(keep) == 0:
            return
        rows_new = [seqs[j] for j in keep]
        start = sched.run(rows_new)
        r = slice(start, start + len(keep))
        self.run_out_row[r], self.run_launched[r] = out_rows[keep], 1
        self.run_cached[r] = [s.prompt_len for s in rows_new]
        self.runner.start_rows(
            r,
            tok[torch.from_numpy(keep).to(self.device)],
            self.run_cached[r],
            [s.seed for s in rows_new],
            [s.blocks for s in rows_new],
        )

    def _launch_step(self, sched: Scheduler, mode, max_new: int):
        """Queue one decode step on the device (no sync). Rows that finished (known from the last
        results) or that will have max_new tokens once the steps in flight return leave first.
        Returns what `_collect` needs to read the step's tokens, or None when no row runs."""
        B = len(sched.running)
        leave = self.done[self.run_out_row[:B]] | (self.run_launched[:B] >= self.limit[self.run_out_row[:B]])
        if leave.any():
            if self.agent is not None:  # the turn is over: the sequence keeps its blocks, off the batch
                for r in np.nonzero(leave)[0]:
                    self._pause(sched.running[r], int(self.run_cached[r]))
            keep = np.nonzero(~leave)[0]
            self.runner.keep_rows(keep, B)
            for arr in (self.run_out_row, self.run_cached, self.run_launched):
                arr[: len(keep)] = arr[keep]
            sched.keep_rows(keep)
            B = len(keep)
        if B == 0:
            return None
        running = sched.running
        N, bs = self.runner.decode_steps, self.block_size
        cached = self.run_cached[:B]
        if N == 1:
            need = np.nonzero(cached % bs == 0)[0]  # rows whose next cached token opens a block
            if len(need):
                self.runner.add_blocks(need, cached[need] // bs, [sched.grow(running[r]) for r in need])
        else:  # blocks for the next N positions, within each row's reservation (past it: scratch block 0)
            rows, cols, blocks = [], [], []
            # a row holds at least ceil(cached / bs) blocks; only those whose next N positions cross into a new one look
            for r in np.nonzero((cached + N + bs - 1) // bs > (cached + bs - 1) // bs)[0]:
                seq = running[r]
                while seq.reserved > 0 and len(seq.blocks) * bs < cached[r] + N:
                    rows.append(r)
                    cols.append(len(seq.blocks))
                    blocks.append(sched.grow(seq))
            if rows:
                self.runner.add_blocks(np.array(rows), np.array(cols), blocks)
        host, event = self.runner.decode(B, mode)
        self.run_cached[:B] += N
        self.run_launched[:B] += N
        return list(running), self.run_out_row[:B].copy(), host, event

    def _collect(self, launched, sched: Scheduler, max_new: int) -> None:
        """Read a launched step's tokens: record them, finish the sequences that ended."""
        seqs, out_rows, host, event = launched
        if event is not None:
            event.synchronize()
        B = len(seqs)
        live = np.nonzero(~self.done[out_rows])[0]  # rows that ended earlier ran wasted steps
        toks = host[0, :, :B].numpy().astype(np.int64).T[live]  # (rows, steps)
        lps = host[1, :, :B].numpy().T[live]
        finished = self._record_steps(out_rows[live], toks, lps)
        ended = live[finished]
        if len(ended) and self.agent is None:
            rows = out_rows[ended]
            sched.postprocess([seqs[r] for r in ended], self.lengths[rows].tolist())
            self._report(rows)
            if self.on_finish is None:  # (a streaming caller decodes the texts in its own thread)
                out = rows.tolist()  # the next step is already queued: the device does not wait for this
                for r, text in zip(out, self._detokenize(out)):
                    self.texts[r] = text

    def _detokenize(self, rows: list[int]) -> list[str]:
        """RESPONSE_TEXT of these output rows, from their tokens so far."""
        return self.tokenizer.batch_decode([self.tok_hist[r, : self.lengths[r]] for r in rows], skip_special_tokens=True)

    def _report(self, rows: np.ndarray) -> None:
        """Hand finished output rows and their tokens to `on_finish`, if the caller gave one."""
        if self.on_finish is not None and len(rows):
            self.on_finish(rows.copy(), [self.tok_hist[r, : self.lengths[r]].copy() for r in rows])

    # -- multi-turn ------------------------------------------------------------------------------
    def _pause(self, seq, cached: int) -> None:
        """`seq` left the batch at the end of a turn with `cached` tokens (prompt + response) in the cache."""
        self.left[seq.out_row] = True
        self.paused[seq.out_row] = (seq, cached)

    def _end_turns(self) -> None:
        """Hand every turn that is over (the sequence left, its last token recorded) to the agent."""
        rows = np.nonzero(self.left & self.done & ~self.notified)[0]
        for row in rows:
            self.notified[row] = True
            turn = self.tok_hist[row, self.turn_start[row] : self.lengths[row]]
            self.agent.end_turn(int(row), turn.tolist(), bool(np.isin(turn[-1:], self.eos_np).any()))
        self.ready.extend(self.agent.poll(block=False))

    def _resume(self, sched: Scheduler, mode, max_new: int, steps: int) -> None:
        """Apply the agent's answers: end trajectories, or append tokens and rejoin the batch.
        `steps`: decode steps run so far in this call (how long answers have waited)."""
        self.ready.extend(self.agent.poll(block=False))
        if not self.ready:
            return
        if self.ready_since is None:
            self.ready_since = steps
        running = len(sched.running)
        # Rejoin together: each extend pass is an eager forward and a host sync, whatever its size.
        # Wait (a few decode steps at most) while others still decode and few answers are in.
        if running and len(self.ready) < max(1, running // 2) and steps - self.ready_since < self.resume_wait_steps:
            return
        rows, seqs, inputs, starts = [], [], [], []
        budget = self.max_num_seqs - running
        while self.ready and len(rows) < budget:
            row, tokens = self.ready.popleft()
            seq, cached = self.paused.pop(row)
            if tokens is None:
                sched.finish(seq)
                continue
            L, k = int(self.lengths[row]), len(tokens)
            cached = min(cached, seq.prompt_len + L)  # a multi-step launch may have run past the turn's end
            if not tokens or L + k >= max_new:
                raise RuntimeError(f"agent: {k} appended tokens after {L} do not leave room for a model token in {max_new}")
            self.tok_hist[row, L : L + k] = tokens
            self.env_hist[row, L : L + k] = True
            self.lengths[row] = L + k
            total = seq.prompt_len + L + k
            while len(seq.blocks) * self.block_size < total:
                sched.grow(seq)
            full = np.concatenate([self.prompt_of[row], self.tok_hist[row, : L + k]])
            rows.append(row)
            seqs.append(seq)
            inputs.append(full[cached:].tolist())
            starts.append(cached)
        self.ready_since = steps if self.ready else None
        if not rows:
            return
        t = time.perf_counter()
        out_rows = np.array(rows)
        self.turn_start[out_rows] = self.lengths[out_rows]
        self.limit[out_rows] = [self.agent.turn_limit(int(r), int(self.lengths[r])) for r in rows]
        self.done[out_rows] = self.left[out_rows] = self.notified[out_rows] = False
        tok, lp = self.runner.extend(inputs, starts, [s.blocks for s in seqs], [s.seed for s in seqs], mode)
        finished = self._record(out_rows, tok.cpu().numpy(), lp.cpu().numpy(), max_new)
        self.extend_passes, self.extend_rows = self.extend_passes + 1, self.extend_rows + len(rows)
        self.extend_s += time.perf_counter() - t
        for j in np.nonzero(finished)[0]:  # the turn ended on its first token
            self._pause(seqs[j], starts[j] + len(inputs[j]))
        keep = np.nonzero(~finished)[0]
        if len(keep) == 0:
            return
        rejoin = [seqs[j] for j in keep]
        start = sched.run(rejoin)
        r = slice(start, start + len(keep))
        self.run_out_row[r] = out_rows[keep]
        self.run_launched[r] = self.lengths[out_rows[keep]]
        self.run_cached[r] = [starts[j] + len(inputs[j]) for j in keep]
        self.runner.start_rows(
            r,
            tok[torch.from_numpy(keep).to(self.device)],
            self.run_cached[r],
            [s.seed for s in rejoin],
            [s.blocks for s in rejoin],
        )

    def _assemble(self, batch: Batch) -> Batch:
        width = int(self.lengths.max())
        responses = torch.from_numpy(self.tok_hist[:, :width].copy())
        lengths = torch.from_numpy(self.lengths)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # through the first EOS
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        batch[K.RESPONSES] = responses
        batch[K.RESPONSE_MASK] = mask
        if self.agent is not None:  # the model's tokens only; the tools' and users' are context
            batch[K.RESPONSE_ATTENTION_MASK] = mask
            mask = mask * torch.from_numpy(~self.env_hist[:, :width]).float()
            batch[K.RESPONSE_MASK] = mask
        batch[K.ROLLOUT_LOG_PROBS] = torch.from_numpy(self.lp_hist[:, :width].copy()) * mask
        texts = list(self.texts)
        todo = [r for r, t in enumerate(texts) if t is None]  # rows the decode loop did not detokenize
        for r, text in zip(todo, self._detokenize(todo) if todo else []):
            texts[r] = text
        batch[K.RESPONSE_TEXT] = texts
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
