"""CUDA graphs of the packed training passes (`actor.use_cuda_graph`).

A packed micro-batch's forward through the decoder (and, in an update, its backward) is a fixed
sequence of a few thousand kernels. When micro-batches are short, the host's launches of those
kernels, not the GPU, set the pass's time: on the fixed-shape cycle of BENCHMARKS.md the update
kept the GPU 41-82% busy, depending on the host's CPU. Here the decoder's forward and backward
are captured once per padded shape and then replayed, one launch each.

**Shapes.** A graph replays fixed shapes, so each micro-batch is padded to a bucket (`plan`):
- the packed row to `n` tokens (`bucket`: at most 1/16 more than it has);
- the row attention runs on (the unshared one under shared prompts) to `v` tokens;
- the number of sequences and the longest sequence to powers of two.
The padding tokens form sequences of their own, `PAD_SEQ` tokens at most, so attention keeps them
apart from the real ones and every padded position holds finite values. Their outputs are never
read, so they get zero gradient. Empty sequences fill `cu_seqlens` up to its padded size.

**What is captured**: the decoder from its input embeddings to the final norm. The embedding
lookup stays eager (its backward reads a count on the host, which a capture cannot take), and so
do the LM head and the loss. The backward graph adds each parameter's gradient into a persistent
buffer, which is the parameter's `.grad` while graphs are used (`_bind_grads`). After an
optimizer's `zero_grad(set_to_none=True)`, the next micro-batch zeroes the buffers and binds
them again.

**Safety.** All graphs of one model share a memory pool, and a forward's saved activations live
there until its backward. So while a graphed forward waits for its backward, any other pass of
that model runs eagerly. Parameters that moved (a checkpoint loaded with `assign`) drop the
graphs. If a capture fails (a host sync in some model's code), graphs are turned off for that
model with a message, and its passes run eagerly as before.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from hybridrl.data.batch import to_device
from hybridrl.models.moe import is_moe

PAD_SEQ = 256  # longest padding sequence (a power of two, so `max_len`'s bucket covers it)
MAX_GRAPHS = 12  # shapes captured per model; beyond that, passes of new shapes run eagerly
SEEN_BEFORE_CAPTURE = 2  # a shape is captured when it comes again: one-off shapes stay eager
KEEP_FREE = 0.35  # no new capture once less than this share of the device's memory is free (KV cache, eager passes)

_RUNNERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # decoder -> DecoderGraphs


def bucket(n: int, floor: int = PAD_SEQ) -> int:
    """`n` rounded up to a multiple of 2^(floor(log2 n) - 4): at most 1/16 more, and few sizes."""
    if n <= floor:
        return floor
    step = 1 << (n.bit_length() - 5)
    return -(-n // step) * step


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _chunks(tokens: int) -> int:
    return -(-tokens // PAD_SEQ)


@dataclass(frozen=True)
class Shape:
    """What one graph replays: packed row of `n` tokens, attention row of `v`, `seqs` sequences
    (cu_seqlens has seqs + 1 entries), attention's `max_len`; shared prompts (gather / take
    indices), gradients, train mode and the autocast dtype."""

    n: int
    v: int
    seqs: int
    max_len: int
    shared: bool
    grad: bool
    training: bool
    amp: torch.dtype | None


def plan(packed, grad: bool, training: bool = True, amp: torch.dtype | None = None) -> Shape:
    """The bucket a packed micro-batch (`models.packing.Packed`) runs in. Host numbers only."""
    N, V = packed.num_tokens, packed.attn_tokens
    shared = packed.prompt_gather is not None
    n = bucket(N)
    P = n - N
    v = bucket(V + P) if shared else n
    Q = v - V - P
    b = packed.cu_seqlens.shape[0] - 1
    seqs = _pow2(b + _chunks(P) + _chunks(Q))
    return Shape(n, v, seqs, _pow2(max(packed.max_len, PAD_SEQ)), shared, grad, training, amp)


def _pad_ends(start: int, tokens: int) -> list[int]:
    """cu_seqlens entries that cut `tokens` padding tokens after `start` into PAD_SEQ-long sequences."""
    return [start + min(i * PAD_SEQ, tokens) for i in range(1, _chunks(tokens) + 1)]


def padded_inputs(packed, shape: Shape) -> dict[str, torch.Tensor]:
    """The micro-batch's inputs at `shape`: `ids` (n,), `positions` (n,), `cu` (seqs + 1,) int32,
    and with shared prompts `gather` (v,) and `take` (n,) (see `Packed`). The real tokens come
    first and keep their values; the device does not wait for the host (pinned copies)."""
    dev = packed.input_ids.device
    N, V = packed.num_tokens, packed.attn_tokens
    P = shape.n - N
    Q = shape.v - V - P
    ends = [V, *_pad_ends(V, P)]
    ends += _pad_ends(ends[-1], Q)
    cu_tail = ends[1:] + [shape.v] * (shape.seqs + 1 - (packed.cu_seqlens.shape[0] + len(ends) - 1))
    pad_pos = torch.arange(P) % PAD_SEQ
    tail = torch.cat([torch.zeros(P, dtype=torch.long), pad_pos, torch.tensor(cu_tail, dtype=torch.long)])
    if shape.shared:  # the padding tokens attend as themselves; the Q tokens of the attention row re-read token 0
        tail = torch.cat([tail, torch.arange(N, N + P), torch.zeros(Q, dtype=torch.long), torch.arange(V, V + P)])
    tail = to_device(tail, dev)
    ids_pad, pos_pad, cu_pad = tail[:P], tail[P : 2 * P], tail[2 * P : 2 * P + len(cu_tail)]
    out = {
        "ids": torch.cat([packed.input_ids[0], ids_pad]),
        "positions": torch.cat([packed.position_ids[0], pos_pad]),
        "cu": torch.cat([packed.cu_seqlens, cu_pad.to(torch.int32)]),
    }
    if shape.shared:
        rest = tail[2 * P + len(cu_tail) :]
        out["gather"] = torch.cat([packed.prompt_gather, rest[: P + Q]])
        out["take"] = torch.cat([packed.prompt_take, rest[P + Q :]])
    return out


def decoder_kwargs(inputs: dict[str, torch.Tensor], max_len: int) -> dict:
    """The packed-attention keywords of a decoder call on padded inputs (`Packed.attention_kwargs`)."""
    cu = inputs["cu"]
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max_len, max_length_k=max_len)
    if "gather" in inputs:
        kw.update(prompt_gather=inputs["gather"], prompt_take=inputs["take"])
    return kw


def run_decoder(
    decoder: nn.Module, embeds: torch.Tensor, inputs: dict[str, torch.Tensor], max_len: int, params: dict | None = None
) -> torch.Tensor:
    """The decoder's final hidden states (1, n, H) from input embeddings (1, n, H) on padded inputs;
    with `params` (name -> tensor), those tensors stand in for the decoder's parameters."""
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=embeds.device)  # a placeholder, as in packed_hidden
    kw = dict(inputs_embeds=embeds, position_ids=inputs["positions"][None], attention_mask=mask, use_cache=False)
    kw.update(decoder_kwargs(inputs, max_len))
    out = decoder(**kw) if params is None else torch.func.functional_call(decoder, params, args=(), kwargs=kw, strict=False)
    return out.last_hidden_state


class _Graph:
    """One captured shape: static inputs, the forward graph and its output, and for gradients
    the backward graph, its incoming gradient and the embeddings' gradient."""

    def __init__(self, shape: Shape, inputs: dict[str, torch.Tensor], embeds: torch.Tensor):
        self.inputs = {k: v.clone() for k, v in inputs.items()}
        self.embeds = embeds.detach().clone().requires_grad_(shape.grad)
        self.fwd = torch.cuda.CUDAGraph()
        self.bwd = torch.cuda.CUDAGraph() if shape.grad else None
        self.out = self.grad_out = self.grad_embeds = None

    def load(self, inputs: dict[str, torch.Tensor], embeds: torch.Tensor) -> None:
        for k, v in inputs.items():
            self.inputs[k].copy_(v)
        with torch.no_grad():
            self.embeds.copy_(embeds)


class _Replay(torch.autograd.Function):
    """A graphed forward as one autograd node: its backward replays the backward graph (which
    adds the parameters' gradients into their `.grad`) and hands the embeddings' gradient on."""

    @staticmethod
    def forward(ctx, embeds, graph: _Graph, runner: DecoderGraphs):
        graph.fwd.replay()
        ctx.graph, ctx.runner, ctx.generation = graph, runner, runner.generation
        runner.inflight = graph
        return graph.out.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        graph, runner = ctx.graph, ctx.runner
        if runner.generation != ctx.generation or runner.inflight is not graph:
            raise RuntimeError(
                "a CUDA-graphed forward's saved activations were reused before its backward ran "
                "(another pass of the model ran in between); set actor_rollout_ref.actor.use_cuda_graph=false"
            )
        graph.grad_out.copy_(grad)
        graph.bwd.replay()
        runner.inflight = None
        return graph.grad_embeds, None, None


class DecoderGraphs:
    """The CUDA graphs of one decoder (an HF backbone whose attention runs the packed `varlen`
    hook): `__call__(packed)` returns its hidden states at the response-predicting positions,
    or None when this pass runs eagerly (see the module docstring)."""

    def __init__(self, decoder: nn.Module):
        self.decoder = weakref.ref(decoder)
        self._collect(decoder)
        self.grads: list[torch.Tensor] | None = None  # the persistent .grad buffers of self.params
        self.graphs: dict[Shape, _Graph] = {}
        self.pool = None
        self.inflight: _Graph | None = None  # a graphed forward whose backward has not run yet
        self.generation = 0  # bumped whenever in-flight activations may be overwritten
        self.off: str | None = None  # why graphs are off for this model
        self.seen: dict[Shape, int] = {}  # passes per shape not captured yet
        self.full = False  # free memory ran low: no new captures
        self.captures = self.replays = self.eager = 0

    # -- bookkeeping -----------------------------------------------------------------------------
    def settle(self) -> None:
        """No backward is pending any more (the engine calls this after an optimizer step): a
        forward whose backward never ran must not block the graphs."""
        if self.inflight is not None:
            self.inflight = None
            self.generation += 1

    def _collect(self, decoder) -> None:
        """The trainable parameters (names, tensors) and their storage addresses."""
        named = [(n, p) for n, p in decoder.named_parameters() if p.requires_grad]
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.ptrs = [p.data_ptr() for p in self.params]

    def _reset(self) -> None:
        self.graphs.clear()
        self.pool, self.inflight = None, None
        self.generation += 1
        self._collect(self.decoder())
        self.grads = None

    def _bind_grads(self) -> None:
        """Make the persistent buffers the parameters' `.grad` (the backward graphs add into them),
        keeping what is accumulated already."""
        if self.grads is None:
            self.grads = [torch.zeros_like(p) for p in self.params]
        zero, src, dst = [], [], []
        for p, g in zip(self.params, self.grads):
            if p.grad is g:
                continue
            if p.grad is None:
                zero.append(g)
            else:
                src.append(p.grad)
                dst.append(g)
            p.grad = g
        if zero:
            torch._foreach_zero_(zero)
        if dst:
            torch._foreach_copy_(dst, src)

    def _turn_off(self, why: str) -> None:
        self.off = why
        self.graphs.clear()
        self.pool = None
        print(f"[hybridrl] use_cuda_graph: off for this model, its passes run eagerly ({why})", flush=True)

    # -- the pass --------------------------------------------------------------------------------
    def __call__(self, packed) -> torch.Tensor | None:
        decoder = self.decoder()
        if self.off or decoder is None or self.inflight is not None:
            self.eager += 1
            return None
        grad = torch.is_grad_enabled() and bool(self.params)
        dev = packed.input_ids.device.type
        amp = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None
        shape = plan(packed, grad, decoder.training, amp)
        if any(p.data_ptr() != q for p, q in zip(self.params, self.ptrs)):
            self._reset()  # new parameter storage: the graphs read the old addresses
        graph = self.graphs.get(shape)
        if graph is None and not self._may_capture(shape, packed.input_ids.device):
            self.eager += 1
            return None
        inputs = padded_inputs(packed, shape)
        embeds = decoder.get_input_embeddings()(inputs["ids"])[None]  # (1, n, H), eager (see the docstring)
        if graph is None:
            try:
                graph = self._capture(decoder, shape, inputs, embeds)
            except RuntimeError as e:  # e.g. an operation the capture does not allow
                self._turn_off(f"capture failed: {str(e).splitlines()[0][:200]}")
                return None
        else:
            graph.load(inputs, embeds)
        self.replays += 1
        if grad:
            self._bind_grads()
            hidden = _Replay.apply(embeds, graph, self)
        else:
            graph.fwd.replay()
            hidden = graph.out
        return hidden[0, packed.target_index]  # (M, H): a new tensor, the graph's output stays static

    def _may_capture(self, shape: Shape, device: torch.device) -> bool:
        """Whether a new shape gets its graphs now. Not before it comes a second time (micro-batches
        of varying lengths make many one-off shapes; each capture costs a few passes and pool
        memory), not past MAX_GRAPHS, and not when the device's free memory runs low: the pools
        stay allocated, and generation's KV cache is sized from what is free."""
        if self.full or len(self.graphs) >= MAX_GRAPHS:
            return False
        self.seen[shape] = self.seen.get(shape, 0) + 1
        if self.seen[shape] < SEEN_BEFORE_CAPTURE:
            return False
        torch.cuda.empty_cache()  # what the allocator caches is free for a capture (which empties it anyway)
        free, total = torch.cuda.mem_get_info(device)
        if free < KEEP_FREE * total:
            self.full = True
            print(
                f"[hybridrl] use_cuda_graph: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free; no more shapes are "
                f"captured for this model ({len(self.graphs)} are), new ones run eagerly",
                flush=True,
            )
            return False
        return True

    def _capture(self, decoder, shape: Shape, inputs, embeds) -> _Graph:
        graph = _Graph(shape, inputs, embeds)
        dev = embeds.device
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        # The capture differentiates fresh leaves over the parameters' storage: a parameter's own
        # autograd leaf may still belong to an eager pass's graph (a loss not freed yet), made on
        # another stream, and autograd would then sync with that stream inside the capture. They
        # are Parameters (that require grad, as `self.params` do) so compiled layers meet the guards
        # of the eager passes and run the code compiled for them (no recompilation for a capture).
        leaves = [nn.Parameter(p.detach()) for p in self.params]
        by_name = dict(zip(self.names, leaves))
        # The caller's autocast, its cache setting included (compiled layers guard on it). No cast
        # copy may cross the capture's edges: one made before it would be read by every replay
        # after its memory is freed; one made during it is the graph's memory. So the cache is
        # emptied before the warm-up, before the capture and after it.
        cache = torch.is_autocast_cache_enabled()
        amp = dict(dtype=shape.amp or torch.float32, enabled=shape.amp is not None, cache_enabled=cache)

        def forward():
            with torch.autocast(dev.type, **amp):
                return run_decoder(decoder, graph.embeds, graph.inputs, shape.max_len, by_name)

        used = list(range(len(leaves)))

        # Warm up on a side stream (compiled layers specialize, cuBLAS picks kernels), then capture.
        torch.clear_autocast_cache()
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):
                out = forward()
                if shape.grad:
                    grads = torch.autograd.grad(out, [graph.embeds, *leaves], torch.zeros_like(out), allow_unused=True)
                    used = [i for i, g in enumerate(grads[1:]) if g is not None]
                    del grads
            del out
        torch.cuda.current_stream(dev).wait_stream(side)
        torch.clear_autocast_cache()  # the warm-up's casts
        with torch.cuda.graph(graph.fwd, pool=self.pool, capture_error_mode="thread_local"):
            graph.out = forward()
        if shape.grad:
            self._bind_grads()
            bufs = [self.grads[i] for i in used]
            graph.grad_out = torch.zeros_like(graph.out)
            with torch.cuda.graph(graph.bwd, pool=self.pool, capture_error_mode="thread_local"):
                grads = torch.autograd.grad(graph.out, [graph.embeds, *(leaves[i] for i in used)], graph.grad_out)
                torch._foreach_add_(bufs, list(grads[1:]))
            graph.grad_embeds = grads[0]
            graph.out = graph.out.detach()
        torch.clear_autocast_cache()
        self.graphs[shape] = graph
        self.captures += 1
        if os.environ.get("HYBRIDRL_GRAPHS_DEBUG"):
            free, _ = torch.cuda.mem_get_info(dev)
            print(f"[graphs] captured {shape} ({len(self.graphs)}); {free / 2**30:.1f} GiB free", flush=True)
        return graph


def why_not(model, decoder, device: torch.device, backend: str | None) -> str | None:
    """Why the packed passes of `model` cannot be graphed, or None when they can."""
    from torch.distributed.fsdp import FSDPModule

    config = decoder.config
    if device.type != "cuda":
        return "CUDA only"
    if backend != "varlen":
        return f"packed_attn_backend={backend} (graphs need varlen: use_remove_padding=true on an sm80+ GPU)"
    if any(isinstance(m, FSDPModule) for m in model.modules()):  # fully_shard'ed (under a LoRA wrapper too)
        return "FSDP-sharded models gather weights on the host's schedule"
    if hasattr(model, "get_base_model") or hasattr(model, "peft_config"):
        return "LoRA adapters switch on and off between passes"
    if getattr(decoder, "gradient_checkpointing", False):
        return "gradient checkpointing"
    if getattr(config, "attention_dropout", 0.0) or getattr(config, "hidden_dropout", 0.0):
        return "dropout"
    if is_moe(config):
        return "a mixture of experts (each pass's routing decides its shapes and may be replayed)"
    return None


def enable(model, decoder, device: torch.device, backend: str | None) -> DecoderGraphs | None:
    """Graph `decoder`'s packed passes (`packing.packed_hidden` replays them); its runner, or None
    with the reason printed when they cannot be graphed."""
    reason = why_not(model, decoder, device, backend)
    if reason is not None:
        print(f"[hybridrl] use_cuda_graph: passes stay eager ({reason})", flush=True)
        return None
    _RUNNERS[decoder] = DecoderGraphs(decoder)
    return _RUNNERS[decoder]


def runner(decoder) -> DecoderGraphs | None:
    """The graphs of `decoder`, if `enable` made them."""
    return _RUNNERS.get(decoder)
