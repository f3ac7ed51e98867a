"""The native rollout engine: paged KV cache, continuous batching, CUDA-graph decode.

One `generate` call:
1. every prompt (left padding stripped) becomes a group of `n` samples waiting for admission;
2. each iteration admits the groups that fit (rows, KV blocks, prefill token budget), prefills
   them right-padded in one forward pass (their K/V go straight into the paged cache), samples
   each sample's first token, and forks the samples onto the prompt's shared blocks;
3. one decode step then runs every running sequence: a single token each, attending over its
   blocks; finished sequences leave and the remaining rows are compacted, so the batch is never
   re-padded and waiting prompts join as soon as blocks free up.

The running rows live in preallocated device buffers (token, position, seed, block-table row);
per step the host only appends the new block ids that sequences crossed into and compacts rows
when some finish. On CUDA the decode step (model forward, paged attention in Triton, fused
sampling) is captured as a CUDA graph per batch size of a ladder (1, 2, 4, ..., max_num_seqs)
and replayed; a batch is padded up to the next size with harmless rows that point at scratch
block 0. On CPU (and with enforce_eager) the same code runs eagerly with the torch references.
"""

from __future__ import annotations

import math
import time
from typing import Iterable
from typing import Sequence as Seq

import numpy as np
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models.llama import build_from_hf_config
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.base import eos_token_ids as default_eos_ids
from hybridrl.rollout.native import triton_kernels
from hybridrl.rollout.native.attention import DecodeAttention, PrefillAttention
from hybridrl.rollout.native.cache import KVCache, blocks_for
from hybridrl.rollout.native.sampling import sample
from hybridrl.rollout.native.scheduler import Group, Scheduler

BLOCK_SIZE = 16
CPU_KV_TOKENS = 1 << 16  # the cache on CPU: a fixed budget of token slots (capped by what can be used)
# Kept free beside the cache on top of the workspace estimate (`_workspace_bytes`): CUDA-graph
# pools, cuBLAS workspaces, allocator fragmentation.
WORKSPACE_SLACK = 512 << 20


def canonical_name(name: str) -> str | None:
    """Map a trainer parameter name (plain HF, torch.compile'd, DDP or peft-wrapped) to the HF name.

    Unmerged LoRA factors cannot be applied by a copy: they raise instead of being dropped
    silently (the engine would sample from the base model).
    """
    for prefix in ("_orig_mod.", "module.", "base_model.model."):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if ".lora_" in name or "lora_embedding" in name:
        raise ValueError(
            f"weight {name!r} is an unmerged LoRA factor; merge the adapters into the base weights "
            f"before syncing them to the native engine (or use rollout.name=hf)"
        )
    return name.replace(".base_layer.", ".")


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
    ):
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.tokenizer, self.hf_config = tokenizer, hf_config
        # from_hf_model passes the HF engine's set (config + generation config + tokenizer)
        self.eos_token_ids = eos_token_ids or default_eos_ids(hf_config, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.max_num_batched_tokens, self.gpu_memory_utilization = max_num_batched_tokens, gpu_memory_utilization
        self.block_size, self.fixed_num_blocks, self.ignore_eos = block_size, num_blocks, ignore_eos
        self.model = build_from_hf_config(
            hf_config, self.dtype, self.device, max_positions=max(max_model_len, hf_config.max_position_embeddings)
        )
        self.model.fuse_projections()
        fast = triton_kernels.available(self.device)
        self.use_graphs = self.device.type == "cuda" and fast and not enforce_eager
        self.use_triton = fast and self.device.type == "cuda"
        self.attn = DecodeAttention(None, triton_kernels if self.use_triton else None)
        self.attn.rope_tables = (self.model.rope_cos, self.model.rope_sin)
        self.cache: KVCache | None = None
        self._cache_ptr: int | None = None
        self.max_blocks_per_seq = blocks_for(max_model_len, block_size)
        self._alloc_row_buffers()
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._graph_pool = None
        self._inv_t: dict[tuple, torch.Tensor] = {}
        self.ladder = _ladder(max_num_seqs)
        self.last_metrics: dict[str, float] = {}

    @classmethod
    def from_hf_model(cls, model, tokenizer, *, share_weights: bool = True, named_weights=None, **kwargs) -> "NativeRolloutEngine":
        """An engine with `model`'s weights: aliased (zero copy) when device and dtype are the same
        and `share_weights`, copied otherwise; or copied from `named_weights` when given."""
        engine = cls(model.config, tokenizer, eos_token_ids=default_eos_ids(model, tokenizer), **kwargs)
        first = next(model.parameters())
        if named_weights is not None:
            engine.load_weights(named_weights)
        elif share_weights and first.device == engine.device and first.dtype == engine.dtype:
            engine.alias_weights(model)
        else:
            engine.load_weights(model.named_parameters())
        return engine

    # -- weights -------------------------------------------------------------------------------
    def alias_weights(self, model) -> None:
        """Make the engine's parameters the trainer's tensors (same storage): in-place optimizer
        steps are then visible to the engine with no sync at all."""
        own = self.model.state_dict()
        shared = {}
        for name, t in model.state_dict().items():
            name = canonical_name(name)
            if name in own:
                shared[name] = t.detach()
        missing = set(own) - set(shared)
        if missing:
            raise ValueError(f"the trainer model has no weights for {sorted(missing)[:5]}")
        self.model.fuse_projections(False)  # fused copies would not see the trainer's updates
        self.model.load_state_dict(shared, assign=True)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy weights in one tensor at a time (converting dtype/device on the way); tensors the
        engine already aliases are skipped. Names the engine does not have raise."""
        params = dict(self.model.named_parameters())
        for name, t in named_tensors:
            name = canonical_name(name)
            if name == "lm_head.weight" and self.model.tied:
                continue  # tied: the embedding is the head
            p = params.get(name)
            if p is None:
                raise KeyError(f"load_weights: the native model has no parameter {name!r}")
            if p.data_ptr() != t.data_ptr():
                p.copy_(t.detach(), non_blocking=True)

    # -- memory --------------------------------------------------------------------------------
    def _alloc_row_buffers(self) -> None:
        S, M, dev = self.max_num_seqs, self.max_blocks_per_seq, self.device
        self.buf_ids = torch.zeros(S, dtype=torch.long, device=dev)
        self.buf_pos = torch.zeros(S, dtype=torch.long, device=dev)  # position of the input token
        self.buf_seeds = torch.zeros(S, dtype=torch.long, device=dev)
        self.buf_tables = torch.zeros(S, M, dtype=torch.int32, device=dev)  # row 0-filled = scratch block
        self.out_tok = torch.zeros(S, dtype=torch.long, device=dev)
        self.out_lp = torch.zeros(S, dtype=torch.float32, device=dev)

    def _num_blocks(self) -> int:
        cfg, m = self.hf_config, self.model
        per_block = KVCache.bytes_per_block(cfg.num_hidden_layers, self.block_size, m.n_kv_heads, m.head_dim, self.dtype)
        useful = self.max_num_seqs * self.max_blocks_per_seq + 1
        if self.fixed_num_blocks is not None:
            return self.fixed_num_blocks
        if self.device.type != "cuda":
            return min(useful, CPU_KV_TOKENS // self.block_size + 1)
        free, _ = torch.cuda.mem_get_info(self.device)
        budget = int(self.gpu_memory_utilization * free) - self._workspace_bytes()
        if budget < 2 * per_block * self.max_blocks_per_seq:
            raise RuntimeError(
                f"native rollout: {free / 2**30:.1f} GiB free x gpu_memory_utilization={self.gpu_memory_utilization} "
                f"leaves no room for a KV cache after {self._workspace_bytes() / 2**30:.1f} GiB of workspace; "
                f"raise actor_rollout_ref.rollout.gpu_memory_utilization or lower max_num_seqs"
            )
        return min(useful, budget // per_block)

    def _workspace_bytes(self) -> int:
        """Activations beside the cache: decode logits (bf16 + fp32 temporaries) and prefill."""
        cfg = self.hf_config
        decode = self.max_num_seqs * cfg.vocab_size * 16
        prefill = self.max_num_batched_tokens * (12 * cfg.hidden_size + 6 * cfg.intermediate_size)
        return decode + prefill + WORKSPACE_SLACK

    def wake(self) -> None:
        """Allocate the KV cache. CUDA graphs bake its address in: they are kept when the new cache
        lands at the same address (the usual case when nothing else moved), re-captured otherwise."""
        if self.cache is not None:
            return
        m = self.model
        self.cache = KVCache(self.hf_config.num_hidden_layers, self._num_blocks(), self.block_size, m.n_kv_heads,
                             m.head_dim, self.dtype, self.device)  # fmt: skip
        self.attn.cache = self.cache
        ptr = self.cache.data.data_ptr()
        if ptr != self._cache_ptr:
            # The graphs' private memory pool goes with them: a pool whose graphs are all gone
            # cannot take a new capture, so the next capture starts a fresh one.
            self.graphs.clear()
            self._graph_pool = None
        self._cache_ptr = ptr

    def sleep(self) -> None:
        """Free the KV cache (the trainer gets the memory); weights and row buffers stay."""
        self.cache = None
        self.attn.cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams, seeds: Seq[int] | None = None) -> Batch:
        """PROMPTS/PROMPT_MASK (left-padded) -> the batch x n with RESPONSES, RESPONSE_MASK,
        ROLLOUT_LOG_PROBS, RESPONSE_TEXT. `seeds` gives each output sequence its seed; by default
        they are drawn from torch's global generator (so torch.manual_seed reproduces a call)."""
        n, max_new = sampling.n, sampling.max_new_tokens
        ids, mask = prompts[K.PROMPTS], prompts[K.PROMPT_MASK].bool()
        total = len(prompts) * n
        if n > self.max_num_seqs:
            raise ValueError(f"rollout.n={n} exceeds rollout.max_num_seqs={self.max_num_seqs}: the samples of a prompt run together")
        longest = int(mask.sum(1).max()) + max_new if len(prompts) else 0
        if longest > self.max_model_len:
            raise ValueError(f"a prompt plus {max_new} new tokens is {longest} tokens, over the engine's max_model_len={self.max_model_len}")
        if seeds is None:
            seeds = (torch.randint(0, 2**31 - 1, (1,)).item() + torch.arange(total) * 7919).tolist()
        if len(seeds) != total:
            raise ValueError(f"seeds: need one per output sequence ({total}), got {len(seeds)}")
        self.wake()
        mode = (0.0 if sampling.greedy else float(sampling.temperature), sampling.top_k, sampling.top_p)
        sched = Scheduler(self.cache.allocator, self.block_size, self.max_num_seqs, self.max_num_batched_tokens)
        for i in range(len(prompts)):
            rows = list(range(i * n, (i + 1) * n))
            sched.waiting.append(Group(ids[i][mask[i]].tolist(), rows, [int(seeds[r]) for r in rows]))
        self._start_run(total, max_new)
        stats = dict(steps=0, decode_s=0.0, peak_usage=0.0)
        t0 = time.perf_counter()
        # Decode runs one step ahead of the host: step k is launched before the results of step
        # k-1 are read, so the host's bookkeeping overlaps the GPU's work. A sequence that ended
        # on EOS at step k-1 therefore runs one wasted step k (its token is dropped).
        pending = None
        while True:
            new = sched.admit(max_new) if sched.waiting else []
            if new:
                self._prefill(sched, new, mode, max_new)
            t = time.perf_counter()
            stats["peak_usage"] = max(stats["peak_usage"], self.cache.usage)
            launched = self._launch_step(sched, mode, max_new)
            if pending is not None:
                self._collect(pending, sched, max_new)
            if launched is not None:
                stats["decode_s"] += time.perf_counter() - t
                stats["steps"] += 1
            pending = launched
            if pending is None and not sched.waiting and not sched.running:
                break
        elapsed = time.perf_counter() - t0
        out = self._assemble(prompts.repeat_interleave(n) if n > 1 else prompts)
        new_tokens = float(out[K.RESPONSE_MASK].sum())
        self.last_metrics = {
            "rollout/kv_cache_usage": stats["peak_usage"],
            "perf/rollout_tokens_per_s": new_tokens / max(elapsed, 1e-9),
            "rollout/decode_steps": stats["steps"],
            "rollout/decode_ms_per_step": 1000 * stats["decode_s"] / max(stats["steps"], 1),
        }
        return out

    # Host state of one generate call, as numpy arrays so a step's bookkeeping is a few vector
    # operations rather than a Python loop over the batch: every output row's tokens and
    # log-probs so far, and per running row its output row, tokens generated and tokens cached.
    def _start_run(self, total: int, max_new: int) -> None:
        self.tok_hist = np.full((total, max_new), self.pad_token_id, dtype=np.int64)
        self.lp_hist = np.zeros((total, max_new), dtype=np.float32)
        self.lengths = np.zeros(total, dtype=np.int64)  # tokens recorded per output row
        self.done = np.zeros(total, dtype=bool)  # per output row
        S = self.max_num_seqs
        # per running row: output row, tokens cached (= position of its next input token), and
        # tokens it will have once every launched step has returned
        self.run_out_row, self.run_cached, self.run_launched = (np.zeros(S, dtype=np.int64) for _ in range(3))
        self.eos_np = np.array(self.eos_token_ids if not self.ignore_eos else [], dtype=np.int64)
        pin = self.device.type == "cuda"
        self.host_out = [torch.empty(2, S, dtype=torch.float64, pin_memory=pin) for _ in range(2)]
        self.step_count = 0

    def _record(self, out_rows: np.ndarray, toks: np.ndarray, lps: np.ndarray, max_new: int) -> np.ndarray:
        """Store one new token for each of `out_rows`; returns which of them are now finished."""
        gen = self.lengths[out_rows]
        self.tok_hist[out_rows, gen] = toks
        self.lp_hist[out_rows, gen] = lps
        self.lengths[out_rows] = gen + 1
        finished = (gen + 1 >= max_new) | np.isin(toks, self.eos_np)
        self.done[out_rows[finished]] = True
        return finished

    def _prefill(self, sched: Scheduler, groups: list[Group], mode, max_new: int) -> None:
        """Prompt forward pass of the admitted groups, their first tokens, and their new rows."""
        dev, bs = self.device, self.block_size
        lens = [len(g.prompt) for g in groups]
        G, T = len(groups), max(lens)
        ids = torch.zeros(G, T, dtype=torch.long)
        slots, valid, seqs, copies = [], [], [], []
        for i, g in enumerate(groups):
            ids[i, : lens[i]] = torch.tensor(g.prompt)
            group_seqs, group_copies = sched.start_group(g, max_new)
            blocks = group_seqs[0].blocks
            slots += [blocks[t // bs] * bs + t % bs for t in range(lens[i])]
            valid += range(i * T, i * T + lens[i])
            seqs += group_seqs
            copies += group_copies
        attn = PrefillAttention(self.cache, torch.tensor(slots, device=dev), torch.tensor(valid, device=dev),
                                triton_kernels if self.use_triton else None, self.attn.rope_tables)  # fmt: skip
        positions = torch.arange(T, device=dev).expand(G, T)
        hidden = self.model.hidden_states(ids.to(dev), positions, attn)  # (G, T, hidden)
        last = hidden[torch.arange(G, device=dev), torch.tensor(lens, device=dev) - 1]  # (G, hidden)
        logits = self.model.logits(last).repeat_interleave(
            torch.tensor([len(g.out_rows) for g in groups], device=dev), dim=0
        )  # (sequences, V)
        self.cache.copy_blocks([s for s, _ in copies], [d for _, d in copies])
        k = len(seqs)
        seed_t = torch.tensor([s.seed for s in seqs], device=dev)
        pos_t = torch.tensor([s.prompt_len for s in seqs], device=dev)  # the first token's position
        tok, lp = torch.empty(k, dtype=torch.long, device=dev), torch.empty(k, device=dev)
        self._sample_into(logits, seed_t, pos_t, mode, tok, lp)
        toks, lps = tok.cpu().numpy(), lp.cpu().numpy()
        out_rows = np.array([s.out_row for s in seqs])
        finished = self._record(out_rows, toks, lps, max_new)
        for s, f in zip(seqs, finished):
            s.generated = 1
            if f:
                sched.finish(s)
        keep = np.nonzero(~finished)[0]
        if len(keep) == 0:
            return
        start, rows_new = len(sched.running), [seqs[j] for j in keep]
        sched.running += rows_new
        r = slice(start, start + len(keep))
        self.run_out_row[r], self.run_launched[r] = out_rows[keep], 1
        self.run_cached[r] = [s.prompt_len for s in rows_new]
        self.buf_ids[r] = tok[torch.from_numpy(keep).to(dev)]
        self.buf_pos[r] = torch.tensor(self.run_cached[r], device=dev)
        self.buf_seeds[r] = torch.tensor([s.seed for s in rows_new], device=dev)
        table = torch.zeros(len(rows_new), self.max_blocks_per_seq, dtype=torch.int32)
        for j, s in enumerate(rows_new):
            table[j, : len(s.blocks)] = torch.tensor(s.blocks, dtype=torch.int32)
        self.buf_tables[r] = table.to(dev)

    def _launch_step(self, sched: Scheduler, mode, max_new: int):
        """Queue one decode step on the device (no sync). Rows that finished (known from the last
        results) or that will have max_new tokens once the steps in flight return leave first.
        Returns what `_collect` needs to read the step's tokens, or None when no row runs."""
        running, B = sched.running, len(sched.running)
        leave = self.done[self.run_out_row[:B]] | (self.run_launched[:B] >= max_new)
        if leave.any():
            keep = np.nonzero(~leave)[0]
            self._compact(keep, B)
            running = sched.running = [running[r] for r in keep]
            B = len(keep)
        if B == 0:
            return None
        cached = self.run_cached[:B]
        need = np.nonzero(cached % self.block_size == 0)[0]  # rows whose next cached token opens a block
        if len(need):
            blocks = [sched.grow(running[r]) for r in need]
            idx = torch.from_numpy(np.stack([need, cached[need] // self.block_size])).to(self.device)
            self.buf_tables[idx[0], idx[1]] = torch.tensor(blocks, dtype=torch.int32, device=self.device)
        Bp = next(s for s in self.ladder if s >= B)
        if self.use_graphs:
            self._graph(Bp, mode).replay()
        else:
            self._decode_forward(Bp, mode)
        host = self.host_out[self.step_count % 2]
        host[0, :B].copy_(self.out_tok[:B], non_blocking=True)
        host[1, :B].copy_(self.out_lp[:B], non_blocking=True)
        event = torch.cuda.Event() if self.device.type == "cuda" else None
        if event is not None:
            event.record()
        self.buf_ids[:B] = self.out_tok[:B]  # the next step's input
        self.buf_pos[:B] += 1
        self.run_cached[:B] += 1
        self.run_launched[:B] += 1
        self.step_count += 1
        return list(running), self.run_out_row[:B].copy(), host, event

    def _collect(self, launched, sched: Scheduler, max_new: int) -> None:
        """Read a launched step's tokens: record them, finish the sequences that ended."""
        seqs, out_rows, host, event = launched
        if event is not None:
            event.synchronize()
        B = len(seqs)
        live = np.nonzero(~self.done[out_rows])[0]  # rows that ended earlier ran a wasted step
        toks = host[0, :B].numpy().astype(np.int64)[live]
        lps = host[1, :B].numpy()[live]
        finished = self._record(out_rows[live], toks, lps, max_new)
        for r in live[finished]:
            seqs[r].generated = int(self.lengths[out_rows[r]])
            sched.finish(seqs[r])

    def _compact(self, keep: np.ndarray, B: int) -> None:
        """Move the rows that keep running to the front, in order; reset the vacated rows."""
        n = len(keep)
        if n:
            idx = torch.from_numpy(keep).to(self.device)
            for buf in (self.buf_ids, self.buf_pos, self.buf_seeds, self.buf_tables):
                buf[:n] = buf[idx]
            for arr in (self.run_out_row, self.run_cached, self.run_launched):
                arr[:n] = arr[keep]
        self.buf_pos[n:B] = 0
        self.buf_tables[n:B] = 0

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
        if self.use_triton and top_k <= 0 and top_p >= 1.0:
            if mode not in self._inv_t:
                self._inv_t[mode] = torch.tensor(1.0 / temperature if temperature > 0 else 1.0, device=self.device)
            triton_kernels.fused_sample(logits, seeds, positions, self._inv_t[mode], tok_out, lp_out, temperature == 0,
                                        pos_offset=pos_offset)  # fmt: skip
        else:
            tok, lp = sample(logits, seeds, positions + pos_offset, temperature, top_k, top_p)
            tok_out.copy_(tok)
            lp_out.copy_(lp)

    def _graph(self, Bp: int, mode) -> torch.cuda.CUDAGraph:
        key = (Bp, mode)
        if key not in self.graphs:
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            # Warm up on a side stream (Triton compiles, cuBLAS picks kernels), then capture.
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                self._decode_forward(Bp, mode)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                self._decode_forward(Bp, mode)
            self.graphs[key] = graph
        return self.graphs[key]

    def _assemble(self, batch: Batch) -> Batch:
        width = int(self.lengths.max())
        responses = torch.from_numpy(self.tok_hist[:, :width].copy())
        lengths = torch.from_numpy(self.lengths)
        mask = (torch.arange(width)[None, :] < lengths[:, None]).float()  # through the first EOS
        batch = Batch(dict(batch.tensors), dict(batch.non_tensors), dict(batch.meta))
        batch[K.RESPONSES] = responses
        batch[K.RESPONSE_MASK] = mask
        batch[K.ROLLOUT_LOG_PROBS] = torch.from_numpy(self.lp_hist[:, :width].copy()) * mask
        batch[K.RESPONSE_TEXT] = self.tokenizer.batch_decode(
            [r[: int(n)] for r, n in zip(responses, lengths)], skip_special_tokens=True
        )
        return batch


def _ladder(max_num_seqs: int) -> list[int]:
    """Captured batch sizes: powers of two below max_num_seqs, then max_num_seqs itself."""
    sizes = [2**i for i in range(int(math.log2(max_num_seqs)) + 1) if 2**i < max_num_seqs]
    return sizes + [max_num_seqs]
