"""Padding-free forward passes: a micro-batch's sequences concatenated into one row.

RL batches are ragged (responses of 20 to 1000 tokens), so a padded (B, P + R) forward spends
most of its FLOPs on padding. Here every sequence (prompt + response, padding stripped) is
laid end to end in one row of N tokens with per-sequence position ids, and attention is kept
inside each sequence by a varlen attention backend hooked into transformers' attention-function
registry, so any Hugging Face causal LM that uses the registry (Llama, Qwen2/3, Mistral, ...)
runs packed without model code of our own:

- `varlen`: FlashAttention-2's varlen kernels through aten (GPU; `_FlashVarlen`);
- `flex`:   FlexAttention with a causal document mask (compiled);
- `sdpa`:   SDPA over per-sequence padded rows, rebuilt inside the attention call (any device;
            the CPU default and the float64 exactness tests).

Only positions that predict a response token leave the backbone: their final hidden states
are gathered before the LM head (`fused_log_probs`) or the value head.

Shared prompts (`pack(..., share_prompts=True)`): the n samples of a GRPO group (or a DPO pair)
repeat one prompt. Its tokens then enter the row once, followed by every member's response, so
the projections and MLPs (nearly all of the FLOPs) run once per prompt instead of once per
sample. Attention still sees each sequence whole: inside the attention call q, k and v are
gathered into the unshared layout (the prompt's keys copied in front of each response; a few
MB), attended per sequence as before, and each packed token takes its output back. The math is
that of the unshared pass (the tests compare in float64, values and gradients); the gradient of
a shared prompt token is the sum over the sequences that read it, as it is unshared.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridrl.data.token_batching import first_of_prompt
from hybridrl.models import graphs as decoder_graphs
from hybridrl.models.logprobs import fused_log_probs

ATTN_PREFIX = "hybridrl_packed"  # registered in transformers' AttentionInterface as hybridrl_packed_<backend>
BACKENDS = ("auto", "varlen", "flex", "sdpa")


def attn_name(backend: str) -> str:
    # The backend lives in the registered name, i.e. in config._attn_implementation, which
    # transformers never writes to config.json: checkpoints stay loadable anywhere.
    return f"{ATTN_PREFIX}_{backend}"


def is_packed(config) -> bool:
    return str(config._attn_implementation).startswith(ATTN_PREFIX)


# -- packing ---------------------------------------------------------------------------------
@dataclass
class Packed:
    """One micro-batch laid out as one row; b sequences, N tokens, M response tokens."""

    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N), restarting at 0 for every sequence
    cu_seqlens: torch.Tensor  # (b + 1,) int32, sequence boundaries in the row
    max_len: int  # longest sequence
    target_index: torch.Tensor  # (M,) positions whose output predicts a response token
    rows: torch.Tensor  # (M,) sequence of each response token
    cols: torch.Tensor  # (M,) its column in the (b, R) response layout
    labels: torch.Tensor  # (M,) the response tokens
    shape: tuple[int, int]  # (b, R)
    # Shared prompts: cu_seqlens / max_len then describe the unshared row (V tokens) that
    # attention runs on; `prompt_gather` (V,) is the packed token at each of its positions and
    # `prompt_take` (N,) the unshared position whose attention output each packed token takes.
    prompt_gather: torch.Tensor | None = None
    prompt_take: torch.Tensor | None = None
    # With `pack(..., token_index=True)`: (b, T) the packed position of each token of the padded
    # (prompts | completions) layout, -1 on padding; a repeated prompt's tokens point at its first
    # row's. Per-token side data (an MoE's recorded routing) packs and unpacks through it.
    token_index: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Tokens the projections and MLPs compute (N)."""
        return self.input_ids.shape[1]

    @property
    def attn_tokens(self) -> int:
        """Tokens of the unshared row (V): the sequences' own lengths summed."""
        return self.num_tokens if self.prompt_gather is None else self.prompt_gather.shape[0]

    def attention_kwargs(self) -> dict:
        """What the packed attention hook reads from the forward's kwargs."""
        cu, longest = self.cu_seqlens, self.max_len
        kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
        if self.prompt_gather is not None:
            kw.update(prompt_gather=self.prompt_gather, prompt_take=self.prompt_take)
        return kw

    def to(self, device) -> Packed:
        """On `device` (host tensors copied without blocking the host: `Batch.to`)."""
        from hybridrl.data.batch import to_device

        tensors = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{k: to_device(v, device) for k, v in tensors.items() if isinstance(v, torch.Tensor)})

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(M,) per-response-token values -> (b, R), zero outside the response mask."""
        out = values.new_zeros(self.shape)
        out[self.rows, self.cols] = values
        return out


def pack(prompts, prompt_mask, responses, response_mask, share_prompts: bool = False, token_index: bool = False) -> Packed:
    """Strip the padding of left-padded prompts (b, P) and right-padded responses (b, R); with
    `share_prompts`, rows with the same prompt carry its tokens once (see the module docstring);
    with `token_index`, `Packed.token_index` is filled."""
    seq = torch.cat([prompts, responses], dim=1)  # (b, T)
    keep = torch.cat([prompt_mask.bool(), response_mask.bool()], dim=1)  # (b, T)
    lens = keep.sum(1)  # (b,)
    prompt_lens = prompt_mask.bool().sum(1)  # (b,)
    if bool((prompt_lens == 0).any()):
        raise ValueError("packing needs at least one prompt token per sequence (the first response token's context)")
    cu = F.pad(lens.cumsum(0), (1, 0))  # (b + 1,)
    positions = keep.long().cumsum(1) - 1  # (b, T)
    rows, cols = response_mask.bool().nonzero(as_tuple=True)  # (M,), row-major
    own, gather, take, index = keep, None, None, None  # the tokens each row puts into the packed row
    if share_prompts:
        first = first_of_prompt(prompts, prompt_mask)
        leader = first == torch.arange(len(first), device=first.device)
        if not bool(leader.all()):
            own, target, gather, take, index = _shared_layout(keep, lens, first, leader, rows, cols, prompts.shape[1])
    if gather is None:
        # Response token j of sequence i sits at cu[i] + prompt_len[i] + j; the output one before predicts it.
        target = cu[rows] + prompt_lens[rows] + cols - 1
    if token_index and index is None:
        index = torch.full(keep.shape, -1, dtype=torch.long, device=keep.device)
        index[keep] = torch.arange(int(lens.sum()), device=keep.device)
    return Packed(
        input_ids=seq[own][None],
        position_ids=positions[own][None],
        cu_seqlens=cu.to(torch.int32),
        max_len=int(lens.max()),
        target_index=target,
        rows=rows,
        cols=cols,
        labels=responses[rows, cols],
        shape=tuple(responses.shape),
        prompt_gather=gather,
        prompt_take=take,
        token_index=index if token_index else None,
    )


def _shared_layout(keep, lens, first, leader, rows, cols, P: int):
    """Where rows repeat prompts: (the tokens each row puts into the packed row (b, T): a prompt
    at its first row only; target_index (M,); prompt_gather (V,); prompt_take (N,); the packed
    position of every token (b, T), -1 on padding). Attention runs on the unshared row, `keep`'s
    tokens in row-major order."""
    b, T = keep.shape
    own = keep.clone()
    own[:, :P] &= leader[:, None]
    index = torch.full((b, T), -1, dtype=torch.long, device=keep.device)  # packed position of each token
    index[own] = torch.arange(int(own.sum()), device=keep.device)
    index[:, :P] = index[first, :P]  # a repeated prompt's tokens are its first row's
    virtual = torch.full((b, T), -1, dtype=torch.long, device=keep.device)  # unshared position
    virtual[keep] = torch.arange(int(lens.sum()), device=keep.device)
    # The token before response column c sits at column P + c - 1 (the last prompt token for c = 0).
    return own, index[rows, P + cols - 1], index[keep], virtual[own], index.masked_fill(~keep, -1)


# -- the attention hook ----------------------------------------------------------------------
def _sequence_index(cu: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of the n packed tokens: (its sequence, its position in the sequence)."""
    lens = (cu[1:] - cu[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(len(lens), device=cu.device), lens, output_size=n)  # (N,)
    return seq, torch.arange(n, device=cu.device) - cu.long()[seq]


def _sdpa_padded(q, k, v, cu, max_len: int, scale):
    """q (N, Hq, D), k/v (N, Hkv, D) -> (N, Hq, D): SDPA over the sequences re-padded to rows."""
    n, b = q.shape[0], cu.shape[0] - 1
    seq, pos = _sequence_index(cu, n)

    def rows(x):  # (N, H, D) -> (b, H, L, D)
        out = x.new_zeros(b, max_len, *x.shape[1:])
        out[seq, pos] = x
        return out.transpose(1, 2)

    # Right padding inside each row: a causal mask already hides it from every real query.
    out = F.scaled_dot_product_attention(
        rows(q), rows(k), rows(v), is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.transpose(1, 2)[seq, pos]


def varlen_available(device: torch.device) -> bool:
    """FlashAttention-2 is built into this torch and runs on this GPU (Ampere, sm80, or newer)."""
    if device.type != "cuda" or not torch.backends.cuda.is_flash_attention_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


class _FlashVarlen(torch.autograd.Function):
    """Causal FlashAttention-2 over the packed row: (N, Hq, D) queries, (N, Hkv, D) keys and
    values, sequences cut by `cu`. aten's kernels directly: they take grouped KV heads as they
    are (torch 2.11's `varlen_attn` wants them repeated to Hq, a copy in and a reduction back),
    and a compiled layer calls them as plain aten ops, not through the Python of a custom op
    (~0.2 ms of host time per call, measured: BENCHMARKS.md)."""

    @staticmethod
    def forward(ctx, q, k, v, cu, max_len, scale):
        out, lse, rng, unused, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, cu, rng, unused)
        ctx.max_len, ctx.scale = max_len, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu, rng, unused = ctx.saved_tensors
        n = ctx.max_len
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu, cu, n, n, 0.0, True, rng, unused, scale=ctx.scale
        )
        return dq, dk, dv, None, None, None


def _varlen(q, k, v, cu, max_len: int, scale):
    return _FlashVarlen.apply(q, k, v, cu, max_len, scale)


_FLEX = None


def _flex_attention():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _FLEX = torch.compile(flex_attention, dynamic=True)
    return _FLEX


def document_block_mask(cu: torch.Tensor, n: int):
    """FlexAttention mask: causal, and only within a token's own sequence."""
    from torch.nn.attention.flex_attention import create_block_mask

    seq, _ = _sequence_index(cu, n)

    def causal_document(b, h, q_idx, kv_idx):
        return (seq[q_idx] == seq[kv_idx]) & (q_idx >= kv_idx)

    return create_block_mask(causal_document, None, None, n, n, device=cu.device)


def packed_attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, *, packed_backend: str = "sdpa", **kwargs
):
    """transformers attention function: varlen over the packed row when the forward carries
    `cu_seq_lens_q` (our packed passes), plain SDPA otherwise (generation, padded passes)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None:
        raise NotImplementedError(
            "packed attention does not support sliding windows or softcapping; "
            "set actor_rollout_ref.model.use_remove_padding=false"
        )
    if dropout and module.training:
        raise NotImplementedError("packed attention does not apply attention dropout; set the model's attention_dropout=0")
    backend = packed_backend
    max_len = int(kwargs["max_length_q"])
    dev = query.device.type
    if torch.is_autocast_enabled(dev):
        # RoPE leaves q, k in the residual stream's float32; the fused kernels want one 16-bit
        # dtype (SDPA gets the same cast from autocast itself).
        dt = torch.get_autocast_dtype(dev)
        query, key, value = query.to(dt), key.to(dt), value.to(dt)
    gather, take = kwargs.get("prompt_gather"), kwargs.get("prompt_take")  # shared prompts (`pack`)
    if backend == "flex":
        if kwargs.get("ulysses_group") is not None:
            raise NotImplementedError("sequence parallelism runs the varlen or sdpa packed backend; set packed_attn_backend=auto")
        if gather is not None:
            query, key, value = (x[:, :, gather] for x in (query, key, value))
        out = _flex_attention()(
            query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1]
        )  # (1, Hq, N, D)
        return (out if take is None else out[:, :, take]).transpose(1, 2), None
    # (1, H, N, D) -> (N, H, D)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    fn = _varlen if backend == "varlen" else _sdpa_padded
    group = kwargs.get("ulysses_group")
    if group is None:
        if gather is None:
            return fn(q, k, v, cu, max_len, scaling)[None], None  # (1, N, Hq, D)
        return fn(q[gather], k[gather], v[gather], cu, max_len, scaling)[take][None], None
    if gather is not None:
        raise NotImplementedError("shared prompts and sequence parallelism do not combine (pack without share_prompts)")
    # Sequence parallel: this rank's N/sp tokens x all heads -> all N tokens x H/sp heads, and back.
    from hybridrl.models import sequence_parallel as ulysses

    k, v = ulysses.expand_kv_heads(k, v, q.shape[1], ulysses.group_size(group))
    q, k, v = (ulysses.seq_to_heads(x, group) for x in (q, k, v))
    return ulysses.heads_to_seq(fn(q, k, v, cu, max_len, scaling), group)[None], None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for backend in BACKENDS[1:]:
        AttentionInterface.register(attn_name(backend), functools.partial(packed_attention_forward, packed_backend=backend))
        # Unpacked calls (generation, the padded fallback) build SDPA masks as before.
        AttentionMaskInterface.register(attn_name(backend), sdpa_mask)


def base_model(model):
    """The transformers model under a peft wrapper (LoRA layers are injected into it in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def resolve_backend(backend: str, device: torch.device) -> str:
    """`auto`: the faster kernel measured on the GPU (BENCHMARKS.md), SDPA rows on CPU."""
    if backend == "auto":
        if device.type != "cuda":
            return "sdpa"
        return "varlen" if varlen_available(device) else "flex"
    if backend == "varlen" and not varlen_available(device):
        raise ValueError(
            "packed_attn_backend=varlen needs FlashAttention-2: a CUDA GPU of compute capability 8.0 or newer "
            "(Ampere, Hopper) and a torch built with it; use auto (flex on other GPUs)"
        )
    return backend


def enable_packing(model, backend: str, device: torch.device) -> str | None:
    """Route the model's attention through the packed hook; returns the backend, or None
    (with the reason printed once) when this model cannot run packed and stays padded."""
    m = base_model(model)
    config = m.config
    reason = None
    if config._attn_implementation != "sdpa" and not is_packed(config):
        reason = f"attn_implementation={config._attn_implementation!r} (the hook wraps sdpa)"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        reason = "sliding-window attention"
    elif any(getattr(config, k, None) for k in ("final_logit_softcapping", "attn_logit_softcapping", "logit_scale")):
        reason = "logit softcapping/scaling"
    if reason:
        print(f"[hybridrl] use_remove_padding: {type(m).__name__} runs padded ({reason})", flush=True)
        return None
    _register()
    backend = resolve_backend(backend, device)
    config._attn_implementation = attn_name(backend)  # the setter passes it on to sub-configs
    return backend


def packed_hidden(backbone, packed: Packed, sp_group=None) -> torch.Tensor:
    """Final hidden states at the M response-predicting positions: (M, H). With `sp_group` (Ulysses
    sequence parallelism, `hybridrl.distributed.ulysses`) each rank of the group computes 1/sp of
    the row and every rank gets all M states."""
    config = backbone.config
    if not is_packed(config):
        # Plain SDPA would attend across the whole packed row: every sequence would see the others.
        raise RuntimeError(
            f"{type(backbone).__name__} runs attn_implementation={config._attn_implementation!r}; "
            "call hybridrl.models.packing.enable_packing on it before packed passes"
        )
    if sp_group is not None:
        return _sequence_parallel_hidden(backbone, packed, sp_group)
    graphs = decoder_graphs.runner(backbone)  # actor.use_cuda_graph (models/graphs.py)
    if graphs is not None:
        hidden = graphs(packed)
        if hidden is not None:
            return hidden
    kwargs = packed.attention_kwargs()
    if config._attn_implementation == attn_name("flex"):
        mask = document_block_mask(packed.cu_seqlens, packed.attn_tokens)
    else:
        # A 4-D placeholder: transformers passes a ready 4-D mask through untouched, so no
        # (N, N) packed-sequence mask is built; the attention hook ignores it.
        mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=packed.input_ids.device)
    out = backbone(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=mask, use_cache=False, **kwargs)
    return out.last_hidden_state[0, packed.target_index]  # (M, H)


def _sequence_parallel_hidden(backbone, packed: Packed, group) -> torch.Tensor:
    """`packed_hidden` under Ulysses sequence parallelism (distributed/ulysses.py): this rank runs
    its 1/sp of the row (padded with one extra sequence to a multiple of sp); the final hidden
    states of the whole row are gathered before picking the response-predicting positions."""
    from hybridrl.models import sequence_parallel as ulysses

    if packed.prompt_gather is not None:
        raise NotImplementedError("shared prompts and sequence parallelism do not combine (pack without share_prompts)")
    if backbone.config._attn_implementation == attn_name("flex"):
        raise NotImplementedError("sequence parallelism runs the varlen or sdpa packed backend; set packed_attn_backend=auto")
    n, sp, rank = packed.num_tokens, ulysses.group_size(group), ulysses.group_rank(group)
    padded, start = ulysses.split_row(n, sp, rank)
    ids, positions, cu, max_len = packed.input_ids, packed.position_ids, packed.cu_seqlens, packed.max_len
    if padded > n:  # the padding tokens form a sequence of their own: nothing attends to them
        fill = torch.arange(padded - n, device=ids.device)[None]
        ids = torch.cat([ids, torch.zeros_like(fill)], dim=1)
        positions = torch.cat([positions, fill], dim=1)
        cu = torch.cat([cu, cu.new_tensor([padded])])
        max_len = max(max_len, padded - n)
    local = slice(start, start + padded // sp)
    mask = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device)
    out = backbone(
        input_ids=ids[:, local],
        position_ids=positions[:, local],
        attention_mask=mask,
        use_cache=False,
        cu_seq_lens_q=cu,
        cu_seq_lens_k=cu,
        max_length_q=max_len,
        max_length_k=max_len,
        ulysses_group=group,
    )
    return ulysses.gather_tokens(out.last_hidden_state, group)[0, packed.target_index]  # (M, H)


def packed_log_probs(model, packed: Packed, *, temperature: float = 1.0, with_entropy: bool = False, sp_group=None):
    """Response log-probs (b, R), entropy (b, R) or None, and argmax hits (b, R) of a packed micro-batch."""
    m = base_model(model)
    head = m.get_output_embeddings()
    hidden = packed_hidden(m.get_decoder(), packed, sp_group)  # (M, H)
    if getattr(head, "bias", None) is not None:
        raise NotImplementedError("packed log-probs need an LM head without bias; set use_remove_padding=false")
    logp, ent, hit = fused_log_probs(hidden, head.weight, packed.labels, temperature=temperature, with_entropy=with_entropy)
    return packed.unpack(logp), (packed.unpack(ent) if ent is not None else None), packed.unpack(hit)
