"""Token log-probs and entropy, and the padded forward pass over prompt + response.

From logits (`response_logits`, the padded path): chunked over rows so that a float32 copy of
`[tokens, vocab]` never exists all at once. From the final hidden states (`fused_log_probs`, the
packed path): the LM head and the softmax algebra fused chunk by chunk, same contract.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """log softmax(logits)[labels]; logits (B, R, V), labels (B, R) -> (B, R) float32."""
    out = []
    for lg, lb in zip(logits.split(chunk), labels.split(chunk)):
        lg = lg.float()
        out.append(lg.gather(-1, lb.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(lg, dim=-1))
    return torch.cat(out)


def entropy_from_logits(logits: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) * z; logits (B, R, V) -> (B, R) float32."""
    out = []
    for lg in logits.split(chunk):
        lg = lg.float()
        p = F.softmax(lg, dim=-1)
        out.append(torch.logsumexp(lg, dim=-1) - (p * lg).sum(-1))
    return torch.cat(out)


def sequence_inputs(prompts, prompt_mask, responses, response_mask):
    """Concatenate left-padded prompts and right-padded responses.

    Returns input_ids (B, T), attention_mask (B, T) and position_ids (B, T) counting from the
    first real prompt token, so that padding never shifts positions.
    """
    input_ids = torch.cat([prompts, responses], dim=1)
    attention_mask = torch.cat([prompt_mask.long(), response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def response_logits(model, prompts, prompt_mask, responses, response_mask, temperature: float = 1.0):
    """Logits that predict each response token: (B, R, V), divided by `temperature`.

    The logit at position t predicts token t+1, so the response's logits start one before it.
    """
    input_ids, attention_mask, position_ids = sequence_inputs(prompts, prompt_mask, responses, response_mask)
    R = responses.shape[1]
    # Only the last R + 1 positions feed the LM head: the prompt's logits (P x V) are never built.
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, logits_to_keep=R + 1
    ).logits
    logits = logits[:, -(R + 1) : -1]  # (B, R, V)
    if temperature not in (0, 1.0):
        logits = logits / temperature
    return logits


# -- fused LM head + log-prob/entropy --------------------------------------------------------
# On ragged RL batches the logits of the response tokens are the largest tensor of the update
# ([tokens, 150k] in float32 is 600 kB per token). `fused_log_probs` goes from the final hidden
# states straight to log-probs (and entropy) chunk by chunk and recomputes a chunk's logits in
# the backward pass, so only O(chunk x vocab) is ever alive. Autocast's bf16 matmul is kept:
# logits are computed in the hidden states' dtype, the softmax algebra in float32.

DEFAULT_CHUNK_ELEMENTS = 1 << 27  # logits elements per chunk: 512 MiB in float32


def _chunk_rows(vocab: int, chunk: int | None) -> int:
    return chunk or max(16, DEFAULT_CHUNK_ELEMENTS // vocab)


def _accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Softmax algebra in float32, or float64 when the inputs are (exactness tests)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunk_stats(z16: torch.Tensor, labels: torch.Tensor, inv_temp: float, want_entropy: bool):
    """Forward algebra of one chunk of logits (c, V): log p(label), logsumexp, entropy, argmax hit."""
    z = z16.to(_accum_dtype(z16.dtype)) * inv_temp  # (c, V)
    lse = torch.logsumexp(z, dim=-1)  # (c,)
    logp = z.gather(-1, labels[:, None]).squeeze(-1) - lse
    hit = z.argmax(-1) == labels
    ent = lse - (torch.exp(z - lse[:, None]) * z).sum(-1) if want_entropy else torch.zeros_like(lse)
    return logp, lse, ent, hit


def _chunk_grad(z16, labels, lse, ent, g_logp, g_ent, inv_temp: float, out=None):
    """d loss / d raw logits of one block (rows, c) of the logits, in the logits' dtype:
    d log p_y / dz = onehot(y) - p;  d H / dz = p * (E_p[z] - z), with E_p[z] = lse - H.
    `labels` count from the block's first vocabulary entry (outside [0, c): no one-hot).
    `out`: where to write it (may be `z16` itself)."""
    z = z16.to(_accum_dtype(z16.dtype)) * inv_temp
    p = torch.exp(z - lse[:, None])  # (rows, c)
    onehot = torch.arange(z.shape[-1], device=z.device)[None] == labels[:, None]  # an iota compare: fuses
    dz = (onehot.to(z.dtype) - p) * g_logp[:, None]
    if g_ent is not None:
        dz = dz + p * ((lse - ent)[:, None] - z) * g_ent[:, None]
    dz = (dz * inv_temp).to(z16.dtype)
    return dz if out is None else out.copy_(dz)


# On CUDA the per-chunk algebra is compiled: each is a handful of passes over (c, V) in eager
# mode, fused into one or two by inductor (the logits' traffic is the cost, not the math).
# Automatic dynamic shapes: the row count (the last chunk differs) becomes dynamic after the
# first recompile, the vocabulary stays static, so the reductions are generated for this vocab
# size and not for a hint from another model's cached compile.
_COMPILED: dict = {}


def _maybe_compiled(fn, device: torch.device):
    if device.type != "cuda":
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=None)
    return _COMPILED[fn]


# On CUDA, hand-written Triton kernels replace the compiled algebra (`logprob_kernels`): one read
# of the logits for the forward statistics instead of Inductor's one loop per dependent
# reduction. False: the compiled functions (the A/B baseline of benchmarks/lab/lm_head_kernels.py).
USE_TRITON = True
# The row gradient's float32 accumulation inside the GEMM (cuBLAS with a float32 C) instead of a
# bf16 product added to it by a second kernel.
GRAD_H_ADDMM = True


def _kernels(device: torch.device, dtype: torch.dtype):
    """(stats, grad) functions for logits of this device and dtype."""
    if USE_TRITON and device.type == "cuda" and dtype != torch.float64:
        try:
            from hybridrl.models import logprob_kernels as k
        except ImportError:  # no triton
            pass
        else:
            return k.logit_stats, k.logit_grad
    return _maybe_compiled(_chunk_stats, device), _maybe_compiled(_chunk_grad, device)


# The backward needs the logits again. Up to this many bytes of them (N x V in the matmul dtype),
# and on CUDA only while they fit in the memory left (`_keep_logits`), the forward keeps them and
# the backward turns them into their gradient in place: one GEMM fewer than recomputing them, and
# the two gradient GEMMs run over the whole vocabulary at once (the GSM8K-shaped update of
# Qwen2.5-0.5B: 4-6% faster, +5.6 GB at its peak; BENCHMARKS.md). Otherwise the backward
# recomputes them slice by slice (memory O(chunk x V)). 0: always recompute.
KEEP_LOGITS_BYTES = 8 << 30


def _keep_logits(hidden: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the forward keeps the logits for the backward (see KEEP_LOGITS_BYTES). On CUDA they
    must fit, with a quarter to spare and 1 GiB for the backward's temporaries, in the device's
    free memory plus what PyTorch's allocator holds unused (it frees that before failing): the
    activations of the pass are all allocated by now, so a run that fitted before still fits. Not
    inside a CUDA-graph capture, whose memory pool would keep them for good. Never under
    `trainer.deterministic` (torch's deterministic algorithms) on CUDA: the choice would depend on
    the memory free at that moment, and the two paths round differently."""
    if not (torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)):
        return False
    need = hidden.shape[0] * weight.shape[0] * dtype.itemsize
    if need > KEEP_LOGITS_BYTES:
        return False
    if hidden.is_cuda:
        if torch.cuda.is_current_stream_capturing() or torch.are_deterministic_algorithms_enabled():
            return False
        free, _ = torch.cuda.mem_get_info(hidden.device)
        room = free + torch.cuda.memory_reserved(hidden.device) - torch.cuda.memory_allocated(hidden.device)
        return need * 5 // 4 + (1 << 30) <= room
    return True


def _logits_buffer(n: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """The kept logits' memory, or None (recompute in the backward) when the device cannot give it
    after all (fragmentation the free-memory check cannot see)."""
    try:
        return torch.empty(n, vocab, dtype=dtype, device=device)
    except torch.OutOfMemoryError:
        return None


class _FusedLogProbs(torch.autograd.Function):
    """(hidden (N, H), weight (V, H), labels (N,)) -> (log_prob (N,), entropy (N,), hit (N,))."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, inv_temp: float, chunk: int, want_entropy: bool, dtype, keep: bool):
        h, w = hidden.to(dtype), weight.to(dtype)
        n, acc = hidden.shape[0], _accum_dtype(dtype)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        lse_all, ent = torch.empty_like(logp), torch.empty_like(logp)
        hit = torch.empty(n, dtype=torch.bool, device=hidden.device)
        stats = _kernels(hidden.device, dtype)[0]
        logits = _logits_buffer(n, weight.shape[0], dtype, hidden.device) if keep else None
        for s in range(0, n, chunk):
            sl = slice(s, s + chunk)
            z = h[sl] @ w.T if logits is None else torch.matmul(h[sl], w.T, out=logits[sl])
            logp[sl], lse_all[sl], ent[sl], hit[sl] = stats(z, labels[sl], inv_temp, want_entropy)
        ctx.save_for_backward(hidden, weight, labels, lse_all, ent)
        ctx.logits = logits  # an intermediate the caller never sees: consumed (overwritten) by backward
        ctx.inv_temp, ctx.chunk, ctx.dtype = inv_temp, chunk, dtype
        ctx.mark_non_differentiable(hit)
        ctx.set_materialize_grads(False)  # an unused entropy arrives as None: no work for it
        return logp, ent, hit

    @staticmethod
    def backward(ctx, g_logp, g_ent, _g_hit):
        # Over slices of the vocabulary, not of the rows: each slice's weight gradient is one GEMM
        # that sums over every row inside the GEMM and is written once. Over row chunks, each
        # chunk's (V, H) product was added to a float32 (V, H) buffer: for Qwen2.5's 152k x 896
        # head, 1.4 GB of traffic per 883-row chunk (~70 ms of a 1.2 s update). The row gradient
        # is what gets accumulated now, (N, H) per slice. A slice's logits are recomputed from h
        # and the saved logsumexp; it holds the same number of elements as a forward chunk.
        hidden, weight, labels, lse_all, ent = ctx.saved_tensors
        logits, ctx.logits = ctx.logits, None
        if g_logp is None and g_ent is None:
            return (None,) * 8
        h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
        acc = lse_all.dtype
        n, vocab = hidden.shape[0], weight.shape[0]
        g_logp = torch.zeros_like(lse_all) if g_logp is None else g_logp.to(acc)
        g_ent = None if g_ent is None else g_ent.to(acc)
        grad = _kernels(hidden.device, ctx.dtype)[1]
        if logits is not None:  # kept by the forward: one slice, the whole vocabulary, turned into its gradient in place
            cols = vocab
        else:
            cols = max(1, ctx.chunk * vocab // max(n, 1))
            if cols >= 128:  # a multiple of 128: unaligned widths send cuBLAS to slow fallback kernels
                cols -= cols % 128
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if ctx.needs_input_grad[0] else None
        grad_w = torch.empty_like(weight) if ctx.needs_input_grad[1] else None
        for v0 in range(0, vocab, cols):
            ws = w[v0 : v0 + cols]
            z = h @ ws.T if logits is None else logits
            dz = grad(z, labels - v0, lse_all, ent, g_logp, g_ent, ctx.inv_temp, out=logits)  # (n, c)
            if grad_h is not None:
                if GRAD_H_ADDMM and grad_h.is_cuda and dz.dtype != acc:  # the GEMM adds in float32 itself
                    torch.addmm(grad_h, dz, ws, out_dtype=acc, out=grad_h)
                else:
                    grad_h.add_(dz @ ws)
            if grad_w is not None:
                grad_w[v0 : v0 + cols] = dz.T @ h  # summed over all rows in the GEMM, rounded once
        if grad_h is not None:
            grad_h = grad_h.to(hidden.dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def fused_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """log softmax(hidden @ weight.T / temperature)[labels] without the full logits.

    hidden (N, H), weight (V, H) (the LM head), labels (N,) -> log_prob (N,) float32 (float64
    for float64 inputs), entropy (N,) or None, hit (N,) bool (argmax == label, for SFT accuracy). Exact in value and
    gradient against the naive computation; memory O(chunk x V) instead of O(N x V).
    """
    inv_temp = 1.0 / temperature if temperature not in (0, 1.0) else 1.0
    rows = _chunk_rows(weight.shape[0], chunk)
    # Matmuls run in autocast's dtype when it is on (as the LM head would), else in hidden's.
    dev = hidden.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else hidden.dtype
    keep = _keep_logits(hidden, weight, dtype)
    with torch.autocast(dev, enabled=False):
        logp, ent, hit = _FusedLogProbs.apply(hidden, weight, labels, inv_temp, rows, with_entropy, dtype, keep)
    return logp, (ent if with_entropy else None), hit
