"""The forward passes a `TrainEngine` runs: the policy's token log-probs and the critic's values.

Both run padding-free (packed rows, `hybridrl.models.packing`) unless the engine's model stays
padded (`use_remove_padding=false`), under the engine's autocast, and count the token slots
they computed (padding included) on the engine for `pad_fraction`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.preference import MASK_OF
from hybridrl.distributed.fsdp import run_as_forward
from hybridrl.distributed.ulysses import sp_group
from hybridrl.models.logprobs import entropy_from_logits, log_probs_from_logits, response_logits
from hybridrl.models.packing import pack, packed_log_probs

SEQ_KEYS = (K.PROMPTS, K.PROMPT_MASK, K.RESPONSES, K.RESPONSE_MASK)  # a sequence pass reads these


def seq_keys(batch: Batch) -> tuple[str, ...]:
    """SEQ_KEYS, plus RESPONSE_ATTENTION_MASK for multi-turn batches (tool tokens are context) and
    ROUTED_EXPERTS when the batch carries a mixture of experts' routing (router replay)."""
    extra = (K.RESPONSE_ATTENTION_MASK, K.ROUTED_EXPERTS)
    return SEQ_KEYS + tuple(k for k in extra if k in batch)


def context_mask(micro: Batch, key: str = K.RESPONSES) -> torch.Tensor:
    """The completion tokens a forward pass reads: every response token of a multi-turn batch
    (the model's and the tools'; outputs at tool tokens are then masked by RESPONSE_MASK), else
    the completion's own mask."""
    if key == K.RESPONSES and K.RESPONSE_ATTENTION_MASK in micro:
        return micro[K.RESPONSE_ATTENTION_MASK]
    return micro[MASK_OF[key]]


PACKED = "packed_on_host"  # micro.meta key: ((key, share_prompts), Packed) from `pack_on_host`


def _sequences(micro: Batch, key: str) -> tuple[torch.Tensor, ...]:
    return micro[K.PROMPTS], micro[K.PROMPT_MASK], micro[key], context_mask(micro, key)


def _shares(engine) -> bool:
    return bool(engine.share_prompts) and sp_group() is None


def pack_on_host(engine, micro: Batch, device) -> Batch:
    """`micro` on `device` with its packed layout (RESPONSES after the prompts) computed on the
    host first. Packing is index math whose sizes depend on the data; on the device's copy each of
    its ~20 size reads waits for the device, so the device would idle while the host queues the
    next kernels. Packed here, the layout goes with the tensors in copies the host does not wait
    for, and the forward takes it from `micro.meta` (`_pack`)."""
    out = micro.to(device)
    if engine.packing and K.PROMPTS in micro and K.RESPONSES in micro:
        share = _shares(engine)
        packed = pack(*_sequences(micro, K.RESPONSES), share_prompts=share, token_index=engine.moe.active)
        out.meta[PACKED] = ((K.RESPONSES, share), packed.to(device))
    return out


def _pack(engine, micro: Batch, key: str):
    """The packed micro-batch, its prompts shared where the engine shares them (not under
    sequence parallelism): the layout `pack_on_host` made, else packed here; counts the token
    slots attention sees and the positions saved."""
    ready = micro.meta.get(PACKED)
    if ready is not None and ready[0] == (key, _shares(engine)):
        packed = ready[1]
    else:
        packed = pack(*_sequences(micro, key), share_prompts=_shares(engine), token_index=engine.moe.active)
    engine.slots += packed.attn_tokens
    engine.shared += packed.attn_tokens - packed.num_tokens
    return packed


def autocast(engine):
    """The engine's autocast context (bf16 on GPUs, off on CPU): every pass of a role runs under it."""
    return torch.autocast(engine.device.type, dtype=engine.amp, enabled=engine.amp is not None)


def log_probs(
    engine,
    model,
    micro: Batch,
    key: str = K.RESPONSES,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
):
    """Log-probs (b, R) of completion field `key` after the prompt, entropy (b, R) or None, and
    argmax hits (b, R); packed (padding-free, fused LM head) when the engine packs. `temperature`
    scales the logits (the rollout's distribution); the entropy keeps a graph only with `entropy_grad`."""
    seqs = _sequences(micro, key)
    real = torch.cat([seqs[1], seqs[3]], dim=1)  # (b, T) real tokens of prompts | completions
    with autocast(engine):
        if engine.packing:
            packed = _pack(engine, micro, key)
            # Under FSDP2 as a forward of the root, which gathers the embeddings and the LM head.
            with engine.moe.pass_(micro, packed.token_index, real, replayable=key == K.RESPONSES):
                return run_as_forward(
                    model, packed_log_probs, packed, temperature=temperature, with_entropy=with_entropy, sp_group=sp_group()
                )
        with engine.moe.pass_(micro, None, real, replayable=key == K.RESPONSES):
            logits = response_logits(model, *seqs, temperature=temperature)  # (b, R, V)
    engine.slots += micro[K.PROMPTS].numel() + micro[key].numel()
    with nullcontext() if entropy_grad else torch.no_grad():  # a (b, R, V) float32 graph only when needed
        entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs_from_logits(logits, micro[key]), entropy, logits.argmax(-1) == micro[key]


def completion_log_probs(forward, micro: Batch, key: str, model=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs of completion field `key` after the prompt, masked: (b, R); and the argmax
    hits (b, R). No temperature: offline objectives score the model's own distribution.
    `forward` is an engine's `run` (over the `log_probs` pass)."""
    log_prob, _, hit = forward(micro, model, key=key, temperature=1.0)
    return log_prob * micro[MASK_OF[key]], hit


def token_log_probs(engine, model, batch: Batch, split, temperature: float) -> torch.Tensor:
    """Response log-probs (B, R) under `model` (the engine's, or the LoRA reference view) at the
    rollout's `temperature`, in the batch's row order, zero outside the response; no gradients."""
    fn = lambda micro: engine.run(micro, model, temperature=temperature)[0].float()  # noqa: E731
    return engine.infer(batch.select(seq_keys(batch)), split, fn) * batch[K.RESPONSE_MASK]


def log_probs_and_routes(engine, model, batch: Batch, split, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_log_probs` of a mixture of experts and the routing its passes used (router replay
    R2 records the old-log-prob pass's): ROUTED_EXPERTS (B, T, L, k) int16, -1 on padding."""

    def fn(micro):
        with engine.moe.recording() as rec:
            log_prob = engine.run(micro, model, temperature=temperature)[0].float()
        return log_prob, rec.routes

    log_prob, routes = engine.infer(batch.select(seq_keys(batch)), split, fn)
    return log_prob * batch[K.RESPONSE_MASK], routes


def summed_log_probs(engine, model, batch: Batch, key: str, split) -> torch.Tensor:
    """Completion field `key`'s log-prob summed over its tokens (B,), in the batch's row order,
    at temperature 1 (offline objectives' reference and KL terms); no gradients."""
    return engine.infer(batch, split, lambda micro: completion_log_probs(engine.run, micro, key, model)[0].sum(-1))


def values(engine, model, micro: Batch) -> torch.Tensor:
    """V (b, R) of a micro-batch from a `ValueModel`; packed unless the engine stays padded."""
    seqs = _sequences(micro, K.RESPONSES)
    with autocast(engine):
        if engine.packing:
            return model.packed_response_values(_pack(engine, micro, K.RESPONSES), sp_group())
        return model.response_values(*seqs)
