"""The native engine's model runner: the model, the KV cache, the device row buffers, and the
prefill and decode forward passes (the decode step captured as CUDA graphs).

The running rows live in preallocated device buffers (token, position, seed, block-table row);
the engine (engine.py) decides which rows run and tells the runner only what changed: the rows
a prefill starts, the new block ids sequences crossed into, the rows that keep running when
some finish. On CUDA the decode step (model forward, paged attention in Triton, fused sampling)
is captured as a CUDA graph per batch size of a ladder (1, 2, 4, ..., max_num_seqs) and
replayed; a batch is padded up to the next size with harmless rows that point at scratch block
0. On CPU (and with enforce_eager) the same code runs eagerly with the torch references.

With a `TensorParallel` group (tp.py) the runner holds one TP shard of the model and of the KV
cache, samples with the parallel sampler, and loads full or pre-sliced weights (`WeightLoader`,
weights.py); at TP=1 none of that code runs. `CacheBudget` sizes the KV cache at each wake-up.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hybridrl.data.batch import to_device
from hybridrl.models import tp_shards
from hybridrl.models.native import build_from_hf_config
from hybridrl.rollout.native import triton_kernels
from hybridrl.rollout.native.attention import DecodeAttention, ExtendAttention, PrefillAttention
from hybridrl.rollout.native.cache import KVCache, blocks_for
from hybridrl.rollout.native.routing import RouteBuffers, RouteHistory
from hybridrl.rollout.native.sampling import sample
from hybridrl.rollout.native.tp import TensorParallel, apply_tp, sample_sharded
from hybridrl.rollout.native.weights import WeightLoader

CPU_KV_TOKENS = 1 << 16  # the cache on CPU: a fixed budget of token slots (capped by what can be used)
# Kept free beside the cache on top of the workspace estimate (`CacheBudget.workspace_bytes`): CUDA-graph
# pools, cuBLAS workspaces, allocator fragmentation.
WORKSPACE_SLACK = 512 << 20


@dataclass
class CacheBudget:
    """How many KV blocks the runner's cache gets at each wake-up: all a full batch can use, or
    what fits in `gpu_memory_utilization` of the free memory after the workspace."""

    hf_config: Any
    model: Any  # the runner's model (its KV heads and head size)
    dtype: torch.dtype
    device: torch.device
    tp: Any  # TensorParallel or None
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_blocks_per_seq: int
    gpu_memory_utilization: float
    fixed_num_blocks: int | None  # the engine's num_blocks: this many, whatever is free

    def num_blocks(self) -> int:
        cfg, m = self.hf_config, self.model
        per_block = KVCache.bytes_per_block(cfg.num_hidden_layers, self.block_size, m.n_kv_heads, m.head_dim, self.dtype)
        useful = self.max_num_seqs * self.max_blocks_per_seq + 1
        if self.fixed_num_blocks is not None:
            return self.fixed_num_blocks
        if self.device.type != "cuda":
            return min(useful, CPU_KV_TOKENS // self.block_size + 1)
        free, _ = torch.cuda.mem_get_info(self.device)
        budget = int(self.gpu_memory_utilization * free) - self.workspace_bytes()
        if budget < useful * per_block:
            # `sleep` leaves freed memory cached in PyTorch's allocator, which the driver does not
            # count as free: give it back before settling for a smaller cache (or none)
            torch.cuda.empty_cache()
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(self.gpu_memory_utilization * free) - self.workspace_bytes()
        if budget < 2 * per_block * self.max_blocks_per_seq:
            raise RuntimeError(
                f"native rollout: {free / 2**30:.1f} GiB free x gpu_memory_utilization={self.gpu_memory_utilization} "
                f"leaves no room for a KV cache after {self.workspace_bytes() / 2**30:.1f} GiB of workspace; "
                f"raise actor_rollout_ref.rollout.gpu_memory_utilization or lower max_num_seqs"
            )
        return min(useful, budget // per_block)

    def workspace_bytes(self) -> int:
        """Activations beside the cache: decode logits (bf16 + fp32 temporaries) and prefill."""
        cfg = self.hf_config
        vocab = tp_shards.vocab_block(cfg.vocab_size, self.tp.size) if self.tp else cfg.vocab_size
        decode = self.max_num_seqs * vocab * 16
        prefill = self.max_num_batched_tokens * self.model.prefill_bytes_per_token()
        return decode + prefill + WORKSPACE_SLACK


class ModelRunner:
    def __init__(
        self,
        hf_config,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        gpu_memory_utilization: float,
        enforce_eager: bool,
        block_size: int,
        num_blocks: int | None,
        tp: TensorParallel | None = None,
        decode_steps: int = 1,
        vocab_limit: int | None = None,
        record_routing: bool = False,
    ):
        """`vocab_limit`: the tokenizer's length; ids at or past it (the embedding's padding rows) are never sampled.
        `record_routing`: a mixture of experts records the experts of every token it runs (routing.py)."""
        self.device, self.dtype, self.hf_config = device, dtype, hf_config
        self.vocab_limit = vocab_limit if vocab_limit is not None and vocab_limit < hf_config.vocab_size else None
        if not (isinstance(decode_steps, int) and 1 <= decode_steps <= 64):
            raise ValueError(f"decode_steps_per_sync must be an integer in [1, 64], got {decode_steps!r}")
        self.decode_steps = decode_steps
        self.tp = tp if tp is not None and tp.size > 1 else None
        self.max_num_seqs, self.block_size = max_num_seqs, block_size
        self.model = build_from_hf_config(
            hf_config,
            dtype,
            device,
            # a multi-step launch may run up to decode_steps past a sequence's end (the tokens are dropped)
            max_positions=max(max_model_len, hf_config.max_position_embeddings) + decode_steps,
            shard=(lambda m: apply_tp(m, self.tp)) if self.tp else None,
        )
        if self.tp:  # padding rows of the last vocabulary block: zero (their logits are masked anyway)
            for p in (self.model.model.embed_tokens.weight, self.model.lm_head_weight):
                p.zero_()
        self.model.fuse_projections()
        self.weights = WeightLoader(self.model, hf_config, self.tp)
        self.routes: RouteBuffers | None = None  # router replay R3: what each pass routed (routing.py)
        self.route_history: RouteHistory | None = None  # the generate call's, set by it
        if record_routing:
            n_sparse = getattr(self.model, "n_sparse", 0)
            if not n_sparse:
                arch = (getattr(hf_config, "architectures", None) or ["?"])[0]
                raise ValueError(
                    f"router replay R3 records a mixture of experts' routing, and {arch} has no sparse layers; "
                    "set actor_rollout_ref.actor.router_replay.mode=disabled"
                )
            self.routes = RouteBuffers(n_sparse, hf_config.num_experts_per_tok, max_num_seqs, decode_steps, device)
        fast = triton_kernels.available(device)
        self.use_graphs = device.type == "cuda" and fast and not enforce_eager
        self.use_triton = fast and device.type == "cuda"
        self.attn = DecodeAttention(None, triton_kernels if self.use_triton else None)
        self.attn.rope_tables = (self.model.rope_cos, self.model.rope_sin)
        self.cache: KVCache | None = None
        self._cache_key: tuple | None = None  # the cache the graphs were captured with (`cache_key`)
        self.max_blocks_per_seq = blocks_for(max_model_len, block_size)
        # block-table columns: past max_model_len, the steps a multi-step launch may overrun point at scratch block 0
        self.table_width = blocks_for(max_model_len + decode_steps, block_size)
        self.budget = CacheBudget(
            hf_config,
            self.model,
            dtype,
            device,
            self.tp,
            block_size,
            max_num_seqs,
            max_num_batched_tokens,
            self.max_blocks_per_seq,
            gpu_memory_utilization,
            num_blocks,
        )
        self._alloc_row_buffers()
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._graph_pool = None
        self.captures, self.capture_s = 0, 0.0  # graphs captured (and the time it took) since start_run
        self._inv_t: dict[tuple, torch.Tensor] = {}
        self.ladder = _ladder(max_num_seqs)
        self._warm: set[tuple] = set()  # (batch size, mode): its kernels compiled and tuned (see _graph)

    # -- memory --------------------------------------------------------------------------------
    def _alloc_row_buffers(self) -> None:
        S, M, N, dev = self.max_num_seqs, self.table_width, self.decode_steps, self.device
        self.buf_ids = torch.zeros(S, dtype=torch.long, device=dev)
        self.buf_pos = torch.zeros(S, dtype=torch.long, device=dev)  # position of the input token
        self.buf_seeds = torch.zeros(S, dtype=torch.long, device=dev)
        self.buf_tables = torch.zeros(S, M, dtype=torch.int32, device=dev)  # row 0-filled = scratch block
        self.out_tok = torch.zeros(S, dtype=torch.long, device=dev)
        self.out_lp = torch.zeros(S, dtype=torch.float32, device=dev)
        self.steps_tok = torch.zeros(N, S, dtype=torch.long, device=dev)  # every step of one launch
        self.steps_lp = torch.zeros(N, S, dtype=torch.float32, device=dev)
        self.row_ids = torch.arange(S, device=dev)
        self.n_active = torch.zeros((), dtype=torch.long, device=dev)  # rows [0, n_active) advance; padding stays

    def wake(self) -> None:
        """Allocate the KV cache. CUDA graphs bake its address and its layout in (each layer's K and
        V sit num_blocks blocks apart): they are kept when the new cache lands at the same address
        with the same number of blocks (the usual case when nothing else moved), re-captured
        otherwise. (A cache of another size at the same address, when the free memory changed
        between steps, made the old graphs read and write past its end.)"""
        if self.cache is not None:
            return
        m = self.model
        num_blocks = self.budget.num_blocks()
        if self.tp:  # one schedule for the whole replica: every rank's cache has the smallest rank's size
            n = torch.tensor([num_blocks], device=self.device)
            dist.all_reduce(n, op=dist.ReduceOp.MIN, group=self.tp.group)
            num_blocks = int(n)
        self.cache = KVCache(
            self.hf_config.num_hidden_layers,
            num_blocks,
            self.block_size,
            m.n_kv_heads,
            m.head_dim,
            self.dtype,
            self.device,
        )
        self.attn.cache = self.cache
        key = cache_key(self.cache)
        if key != self._cache_key:
            # The graphs' private memory pool goes with them: a pool whose graphs are all gone
            # cannot take a new capture, so the next capture starts a fresh one.
            self.graphs.clear()
            self._graph_pool = None
        self._cache_key = key

    def sleep(self) -> None:
        """Free the KV cache; weights and row buffers stay. The memory goes back to PyTorch's
        caching allocator, where the trainer in this process takes it, and not to the driver:
        `torch.cuda.empty_cache()` here unmapped it, and the trainer's own cached blocks with it,
        so that the update, the log-prob passes and the next wake-up mapped it all again (0.18 s
        of the GSM8K step on an H100, BENCHMARKS.md). An allocation that finds no room still
        releases the cached memory to the driver and retries."""
        self.cache = None
        self.attn.cache = None

    # -- one generate call ---------------------------------------------------------------------
    def start_run(self) -> None:
        """Pinned host buffers the decode steps' tokens and log-probs come back through (two, so
        a step's results are read while the next step is already queued)."""
        pin = self.device.type == "cuda"
        S = self.max_num_seqs
        self.host_out = [torch.empty(2 * self.decode_steps * S, dtype=torch.float64, pin_memory=pin) for _ in range(2)]
        self.step_count = 0
        self.captures, self.capture_s = 0, 0.0

    def prefill(
        self,
        prompts: list[list[int]],
        blocks: list[list[int]],
        samples: list[int],
        copies: list[tuple[int, int]],
        seeds: list[int],
        mode,
        route_rows: list[list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt forward pass of one admitted group per prompt (its K/V into `blocks`, the
        prompt's block table), then the first token of each of its `samples` sequences.
        `copies`: (source, destination) blocks to copy once the prompt's K/V are written (each
        sample's own copy of the partial last block). Returns device tensors (tokens, log-probs)
        with one entry per sequence, the samples of a prompt adjacent. `route_rows`: the output
        rows of each prompt (recording the routing, `routes`)."""
        dev, bs = self.device, self.block_size
        lens = [len(p) for p in prompts]
        G, T = len(prompts), max(lens)
        ids = torch.zeros(G, T, dtype=torch.long)
        slots, valid = [], []
        for i, (p, b) in enumerate(zip(prompts, blocks)):
            ids[i, : lens[i]] = torch.tensor(p)
            slots += [b[t // bs] * bs + t % bs for t in range(lens[i])]
            valid += range(i * T, i * T + lens[i])
        attn = PrefillAttention(
            self.cache,
            torch.tensor(slots, device=dev),
            torch.tensor(valid, device=dev),
            triton_kernels if self.use_triton else None,
            self.attn.rope_tables,
        )
        positions = torch.arange(T, device=dev).expand(G, T)
        with self._routes_of_pass(G, T, lens, [0] * G, route_rows):
            hidden = self.model.hidden_states(ids.to(dev), positions, attn)  # (G, T, hidden)
        last = hidden[torch.arange(G, device=dev), torch.tensor(lens, device=dev) - 1]  # (G, hidden)
        logits = self.model.logits(last).repeat_interleave(torch.tensor(samples, device=dev), dim=0)  # (sequences, V)
        self.cache.copy_blocks([s for s, _ in copies], [d for _, d in copies])
        k = len(seeds)
        seed_t = torch.tensor(seeds, device=dev)
        pos_t = torch.tensor([L for L, n in zip(lens, samples) for _ in range(n)], device=dev)  # the first token's position
        tok, lp = torch.empty(k, dtype=torch.long, device=dev), torch.empty(k, device=dev)
        self._sample_into(logits, seed_t, pos_t, mode, tok, lp)
        return tok, lp

    def extend(
        self,
        tokens: list[list[int]],
        starts: list[int],
        tables: list[list[int]],
        seeds: list[int],
        mode,
        samples: list[int] | None = None,
        copies: list[tuple[int, int]] | None = None,
        sample: bool = True,
        route_rows: list[list[int]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Append `tokens[i]` to sequence i, which has `starts[i]` tokens cached in blocks
        `tables[i]` (already long enough for the new ones): their K/V go into the cache, and the
        sequence's next token is sampled after the last of them (at position starts[i] + len).
        Returns device tensors (tokens, log-probs), one per sequence.

        `samples[i]` > 1 (a prompt's remainder after a prefix-cache hit): `samples[i]` sequences
        sample their first tokens from row i's logits (with their own seeds: `seeds` has one per
        sequence), and `copies` are (source, destination) blocks copied once the K/V are written,
        as in `prefill`. `sample=False` (a chunk of a long prompt that is not its last): only the
        K/V are written; returns None. `route_rows`: the output rows of each sequence (recording
        the routing, `routes`)."""
        dev, bs = self.device, self.block_size
        lens = [len(t) for t in tokens]
        G, T = len(tokens), max(lens)
        table = np.zeros((G, self.table_width), dtype=np.int32)
        ids_np = np.zeros((G, T), dtype=np.int64)
        for i, (new, blocks) in enumerate(zip(tokens, tables)):
            ids_np[i, : lens[i]] = new
            table[i, : len(blocks)] = blocks
        lens_np, starts_np = np.asarray(lens), np.asarray(starts)
        pos_np = starts_np[:, None] + np.minimum(np.arange(T)[None, :], lens_np[:, None] - 1)  # padding repeats the last position
        valid_np = np.arange(T)[None, :] < lens_np[:, None]
        p = pos_np[valid_np]  # positions of the new tokens, row by row
        slots = table[np.repeat(np.arange(G), lens_np), p // bs].astype(np.int64) * bs + p % bs
        ids, positions = torch.from_numpy(ids_np), torch.from_numpy(pos_np).to(dev)
        slots_t = torch.from_numpy(slots).to(dev)
        valid_t = torch.from_numpy(np.flatnonzero(valid_np)).to(dev)
        context = int((starts_np + lens_np).max())
        attn = ExtendAttention(self.cache, slots_t, valid_t, torch.from_numpy(table).to(dev), positions, context)
        with self._routes_of_pass(G, T, lens, starts, route_rows):
            hidden = self.model.hidden_states(ids.to(dev), positions, attn)  # (G, T, hidden)
        if not sample:
            return None
        last = hidden[torch.arange(G, device=dev), torch.tensor(lens, device=dev) - 1]  # (G, hidden)
        logits = self.model.logits(last)
        samples = samples or [1] * G
        if any(n != 1 for n in samples):
            logits = logits.repeat_interleave(torch.tensor(samples, device=dev), dim=0)
        if copies:
            self.cache.copy_blocks([a for a, _ in copies], [b for _, b in copies])
        k = sum(samples)
        pos_t = torch.tensor([s + n for s, n, m in zip(starts, lens, samples) for _ in range(m)], device=dev)  # next position
        tok, lp = torch.empty(k, dtype=torch.long, device=dev), torch.empty(k, device=dev)
        self._sample_into(logits, torch.tensor(seeds, device=dev), pos_t, mode, tok, lp)
        return tok, lp

    @contextlib.contextmanager
    def _routes_of_pass(self, G: int, T: int, lens: list[int], starts: list[int], route_rows):
        """Around a prefill/extend forward: its routing into the call's history (when recorded)."""
        if self.routes is None or route_rows is None:
            yield
            return
        buf = self.model.route_sink.buf = self.routes.pass_buffer(G * T, self.device)
        try:
            yield
        finally:
            self.model.route_sink.buf = None
        self.route_history.store_pass(buf.view(G, T, *buf.shape[1:]), lens, starts, route_rows)

    def start_rows(
        self, r: slice, first_tokens: torch.Tensor, positions: np.ndarray, seeds: list[int], tables: list[list[int]]
    ) -> None:
        """Rows `r` start decoding: their input token (on the device), its position, seed and
        block table."""
        self.buf_ids[r] = first_tokens
        self.buf_pos[r] = self._to_device(positions, torch.long)
        self.buf_seeds[r] = self._to_device(seeds, torch.long)
        table = np.zeros((len(tables), self.table_width), dtype=np.int32)
        for j, t in enumerate(tables):
            table[j, : len(t)] = t
        self.buf_tables[r] = self._to_device(table, torch.int32)

    def add_blocks(self, rows: np.ndarray, cols: np.ndarray, blocks: list[int]) -> None:
        """Block `blocks[i]` becomes entry `cols[i]` of row `rows[i]`'s block table."""
        idx = self._to_device(np.stack([rows, cols]), torch.long)
        self.buf_tables[idx[0], idx[1]] = self._to_device(blocks, torch.int32)

    def keep_rows(self, keep: np.ndarray, B: int) -> None:
        """Move the rows that keep running to the front, in order; reset the vacated rows."""
        n = len(keep)
        if n:
            idx = self._to_device(keep, torch.long)
            for buf in (self.buf_ids, self.buf_pos, self.buf_seeds, self.buf_tables):
                buf[:n] = buf[idx]
        self.buf_pos[n:B] = 0
        self.buf_tables[n:B] = 0

    def _to_device(self, x, dtype: torch.dtype) -> torch.Tensor:
        """Host data (a list or an array) on the device without the host waiting for the step in
        flight (`data.batch.to_device`: through pinned memory)."""
        return to_device(torch.as_tensor(x, dtype=dtype), self.device)

    def decode(self, B: int, mode):
        """Queue `decode_steps` decode steps of rows [0, B) on the device (no sync; one CUDA graph
        replay) and the copy of their tokens and log-probs to a pinned host buffer; each step's
        input is the previous step's token. Returns (host buffer (2, steps, S): tokens and
        log-probs, event to wait on before reading it; None on CPU)."""
        Bp = next(s for s in self.ladder if s >= B)
        N = self.decode_steps
        self.n_active.fill_(B)
        if self.use_graphs:
            self._graph(Bp, mode).replay()
        else:
            self._decode_steps(Bp, mode)
        # a contiguous (2, N, B) view: a strided host destination would be copied through a
        # pageable temporary, which makes the host wait for the step
        host = self.host_out[self.step_count % 2][: 2 * N * B].view(2, N, B)
        host[0].copy_(self.steps_tok[:N, :B], non_blocking=True)
        host[1].copy_(self.steps_lp[:N, :B], non_blocking=True)
        if self.routes is not None:  # the launch's routing, read with its tokens (`last_routes`)
            self.last_routes = self.routes.copy_out(N, B, self.step_count % 2)
        event = torch.cuda.Event() if self.device.type == "cuda" else None
        if event is not None:
            event.record()
        self.step_count += 1
        return host, event

    def _decode_steps(self, Bp: int, mode) -> None:
        """`decode_steps` tokens for rows [0, Bp), each step's token the next one's input; the
        rows past n_active (batch padding) keep their position."""
        active = (self.row_ids[:Bp] < self.n_active).long()
        for s in range(self.decode_steps):
            if self.routes is not None:  # step s's routing (a CUDA graph bakes the buffer in)
                self.model.route_sink.buf = self.routes.steps[s, :Bp]
            self._decode_forward(Bp, mode)
            self.steps_tok[s, :Bp] = self.out_tok[:Bp]
            self.steps_lp[s, :Bp] = self.out_lp[:Bp]
            self.buf_ids[:Bp] = self.out_tok[:Bp]  # the next step's input
            self.buf_pos[:Bp] += active
        if self.routes is not None:
            self.model.route_sink.buf = None

    def _decode_forward(self, Bp: int, mode) -> None:
        """One token for rows [0, Bp): reads the row buffers, writes out_tok / out_lp."""
        ids, pos, tables = self.buf_ids[:Bp], self.buf_pos[:Bp], self.buf_tables[:Bp]
        blk = tables.gather(1, (pos // self.block_size)[:, None])[:, 0]  # (Bp,) block of the new token
        self.attn.slots = blk.long() * self.block_size + pos % self.block_size
        self.attn.block_tables = tables
        self.attn.context_lens = (pos + 1).to(torch.int32)
        self.attn.positions = pos
        hidden = self.model.hidden_states(ids[:, None], pos[:, None], self.attn)[:, 0]  # (Bp, hidden)
        logits = self.model.logits(hidden)  # (Bp, V)
        # the sampled token's position is pos + 1 (the hash key's input)
        self._sample_into(logits, self.buf_seeds[:Bp], pos, mode, self.out_tok[:Bp], self.out_lp[:Bp], pos_offset=1)

    def _sample_into(self, logits, seeds, positions, mode, tok_out, lp_out, pos_offset: int = 0) -> None:
        temperature, top_k, top_p = mode
        if self.tp:
            m = self.model
            args = (m.vocab_start, m.vocab_valid, self.hf_config.vocab_size, self.vocab_limit)
            tok, lp = sample_sharded(logits, seeds, positions + pos_offset, temperature, top_k, top_p, self.tp, *args)
            tok_out.copy_(tok)
            lp_out.copy_(lp)
        elif self.use_triton and top_k <= 0 and top_p >= 1.0:
            if mode not in self._inv_t:
                self._inv_t[mode] = torch.tensor(1.0 / temperature if temperature > 0 else 1.0, device=self.device)
            triton_kernels.fused_sample(
                logits,
                seeds,
                positions,
                self._inv_t[mode],
                tok_out,
                lp_out,
                temperature == 0,
                pos_offset=pos_offset,
                vocab_limit=self.vocab_limit,
            )
        else:
            tok, lp = sample(logits, seeds, positions + pos_offset, temperature, top_k, top_p, self.vocab_limit)
            tok_out.copy_(tok)
            lp_out.copy_(lp)

    def _warm_up(self, sizes: list[int], mode) -> None:
        """Run the decode steps of each batch size once, eagerly, and undo their effect on the rows.
        Triton compiles its kernels for each size's specialization (sizes of 1, and sizes that are
        not multiples of 16, compile apart) and the fused attention tunes its tile for each
        batch-size band; cuBLAS picks its kernels. Rows past n_active are padding: their block
        tables point at scratch block 0, so their K/V writes land there. The K/V the active rows
        write now is written again, the same, by the real step."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            saved = self.buf_ids.clone(), self.buf_pos.clone()
            for b in sizes:
                self._decode_steps(b, mode)
                self.buf_ids.copy_(saved[0])
                self.buf_pos.copy_(saved[1])
                self._warm.add((b, mode))
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _graph(self, Bp: int, mode) -> torch.cuda.CUDAGraph:
        key = (Bp, mode)
        if key not in self.graphs:
            t0 = time.perf_counter()
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            # Warm up on a side stream, then capture. The first capture of a mode also warms up
            # every smaller size of the ladder: a batch shrinks as its sequences end, and a size
            # first met mid-run cost its compilation and tuning then (3.8 s in one step of a GSM8K
            # run on an H100, BENCHMARKS.md); now the first step pays it, and a later capture of a
            # size, or a capture again after the KV cache moved, is only the capture.
            # Bp itself always runs right before its capture (the capture replays the allocator's blocks).
            self._warm_up([b for b in self.ladder if b < Bp and (b, mode) not in self._warm] + [Bp], mode)
            graph = torch.cuda.CUDAGraph()
            if self.tp:
                # The NCCL watchdog thread queries the events of earlier collectives; let it finish them first.
                torch.cuda.synchronize(self.device)
            # Other threads' CUDA calls (the NCCL watchdog's queries, passes run while decoding)
            # must not invalidate the capture: only this thread's are checked.
            with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode="thread_local"):
                self._decode_steps(Bp, mode)
            self.graphs[key] = graph
            self.captures += 1
            self.capture_s += time.perf_counter() - t0
        return self.graphs[key]


def cache_key(cache: KVCache) -> tuple:
    """What decode graphs bake in of a KV cache: its address and its shape (the layers' offsets)."""
    return cache.data.data_ptr(), tuple(cache.data.shape)


def _ladder(max_num_seqs: int) -> list[int]:
    """Captured batch sizes: powers of two below max_num_seqs, then max_num_seqs itself."""
    sizes = [2**i for i in range(int(math.log2(max_num_seqs)) + 1) if 2**i < max_num_seqs]
    return sizes + [max_num_seqs]
