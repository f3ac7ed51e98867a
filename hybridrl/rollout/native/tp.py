"""Tensor parallelism inside the native engine: the decoder cut into TP shards, and the parallel sampler.

`apply_tp(model, tp)` rewrites a `DecoderLM` built on the meta device (before any memory is
allocated) so that it holds only rank `tp.rank`'s shard, as `hybridrl.models.tp_shards` defines
it (the resharder sends exactly those pieces):

- q/k/v and gate/up become column-parallel: plain linears with the rank's output rows, so the
  heads / intermediate features a rank computes are its own and `fuse_projections` still fuses
  them (the fused q|k|v is just narrower). Attention runs on the rank's heads only; the KV cache
  holds only the rank's KV heads (with fewer KV heads than ranks, each is replicated);
- o_proj and down_proj become row-parallel (`RowParallelLinear`): a partial product, one
  all-reduce over the TP group, then the (whole) bias once — two all-reduces per layer;
- a mixture of experts (models/moe_decoder.py) keeps E / tp whole experts per rank and the
  router whole; the rank's assignments and the shared expert's slice give a partial output,
  all-reduced once per layer;
- the embedding becomes vocabulary-parallel (`VocabParallelEmbedding`): each rank looks up the
  ids in its block of ceil(V / tp) rows, zeros the others, and one all-reduce sums the blocks;
  the LM head produces the rank's block of logits (the last block padded to the same width).

The parallel sampler (`sample_sharded`) never gathers the logits for plain sampling and greedy
decoding. Each rank computes, on its vocabulary block, the Gumbel-max candidate (the noise is
keyed by the *global* vocabulary index, as at TP=1), its scaled logit and the block's
logsumexp; the ranks all-gather those four numbers per row and every rank picks the same
winner (the largest perturbed logit; ties go to the lowest index, as `argmax` does) and the
full-vocabulary log-prob, logit - logsumexp over the blocks' logsumexps. That is exactly the
TP=1 sample: the same token for the same seed, the same log-prob up to float rounding.
Top-k / top-p need the whole sorted row: the blocks are all-gathered and every rank runs the
TP=1 sampler on the same full row. Either way every rank of a replica ends with bit-identical
tokens, so their schedulers stay in lock step without further communication.

Every collective is an in-place torch.distributed call on fixed-size tensors: gloo on CPU, and
on GPUs NCCL captured inside the decode CUDA graphs (`enforce_eager` runs them eagerly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hybridrl.models import tp_shards
from hybridrl.models.moe_decoder import Experts, MoeMLP
from hybridrl.rollout.native.sampling import gumbel_noise, mask_unsampled, row_keys, sample


@dataclass(frozen=True)
class TensorParallel:
    """The TP group of one rollout replica and this process's place in it."""

    group: object  # a torch.distributed ProcessGroup
    rank: int
    size: int

    @classmethod
    def of(cls, group) -> "TensorParallel":
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    @property
    def src(self) -> int:
        """The global rank of the replica's first rank (the one whose seeds the replica uses)."""
        return dist.get_global_rank(self.group, 0)


def all_gather(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """(...) on each rank -> (tp, ...) on every rank, in rank order."""
    out = x.new_empty(tp.size, *x.shape)
    if x.is_cuda:
        dist.all_gather_into_tensor(out, x.contiguous(), group=tp.group)
    else:  # gloo: the list form
        dist.all_gather(list(out.unbind(0)), x.contiguous(), group=tp.group)
    return out


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_shard @ W_shard^T) + b: the rank's input columns of W, the bias whole
    (added once, after the sum). Same parameter names as nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel):
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        dist.all_reduce(y, group=self.tp.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """The rank's block of embedding rows [start, start + valid) (padded to `block` rows):
    ids outside the block look up a zero vector, and the all-reduce sums the blocks."""

    def __init__(self, block: int, dim: int, start: int, valid: int, tp: TensorParallel):
        super().__init__(block, dim)
        self.start, self.valid, self.tp = start, valid, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        inside = (local >= 0) & (local < self.valid)  # (B, T)
        out = F.embedding(local.clamp(0, self.num_embeddings - 1), self.weight) * inside.unsqueeze(-1).to(self.weight.dtype)
        dist.all_reduce(out, group=self.tp.group)
        return out


def apply_tp(model, tp: TensorParallel) -> None:
    """Cut a `DecoderLM` (on the meta device) down to rank `tp.rank`'s shard, in place."""
    cfg = model.config
    problem = tp_shards.check_tp(cfg, tp.size)
    if problem:
        raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size: {problem}")
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    local_kv = max(kv // tp.size, 1)
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        d = a.head_dim
        a.n_heads, a.n_kv = heads // tp.size, local_kv
        a.q_proj = _linear(a.q_proj, out=a.n_heads * d)
        a.k_proj = _linear(a.k_proj, out=local_kv * d)
        a.v_proj = _linear(a.v_proj, out=local_kv * d)
        a.o_proj = RowParallelLinear(a.n_heads * d, a.o_proj.out_features, a.o_proj.bias is not None, tp)
        if isinstance(m, MoeMLP):
            _shard_experts(m, tp)
        else:
            _shard_mlp(m, tp, RowParallelLinear)
    V, hidden = cfg.vocab_size, cfg.hidden_size
    block = tp_shards.vocab_block(V, tp.size)
    start = min(tp.rank * block, V)
    model.model.embed_tokens = VocabParallelEmbedding(block, hidden, start, min(V, start + block) - start, tp)
    if not model.tied:
        model.lm_head = nn.Linear(hidden, block, bias=False)
    model.n_kv_heads = local_kv
    model.tp = tp
    model.vocab_start, model.vocab_valid = start, min(V, start + block) - start


def _shard_mlp(m, tp: TensorParallel, row) -> None:
    """A dense MLP's gate/up column-parallel, its down_proj `row` (RowParallelLinear, or a plain
    linear whose partial sum the caller reduces)."""
    inter = m.gate_proj.out_features // tp.size
    m.gate_proj = _linear(m.gate_proj, out=inter)
    m.up_proj = _linear(m.up_proj, out=inter)
    if row is RowParallelLinear:
        m.down_proj = RowParallelLinear(inter, m.down_proj.out_features, m.down_proj.bias is not None, tp)
    else:
        m.down_proj = nn.Linear(inter, m.down_proj.out_features, bias=False)


def _shard_experts(m: MoeMLP, tp: TensorParallel) -> None:
    """A mixture of experts: E / tp whole experts per rank (`tp_shards`), the router replicated,
    a shared expert split like a dense MLP without its own all-reduce; the layer all-reduces
    the sum of both partial outputs once."""
    e = m.experts
    n = e.gate_up_proj.shape[0] // tp.size
    inter, hidden = e.down_proj.shape[-1], e.down_proj.shape[1]
    m.experts = Experts(n, hidden, inter, first=tp.rank * n)
    if m.shared_expert is not None:
        _shard_mlp(m.shared_expert, tp, nn.Linear)
    m.tp = tp


def _linear(lin: nn.Linear, out: int) -> nn.Linear:
    return nn.Linear(lin.in_features, out, bias=lin.bias is not None)


def sample_sharded(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    tp: TensorParallel,
    vocab_start: int,
    vocab_valid: int,
    vocab_size: int,
    vocab_limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The TP=1 `sample` over logits split by vocabulary blocks: logits (B, block) are this
    rank's columns [vocab_start, vocab_start + vocab_valid) (the rest padding) -> tokens (B,)
    int64 and log-probs (B,) float32, the same on every rank of the group. Ids at or past
    `vocab_limit` are never drawn."""
    block = logits.shape[-1]
    if top_k > 0 or top_p < 1.0:  # sorting needs the whole row: gather it, sample as at TP=1
        full = all_gather(logits, tp).permute(1, 0, 2).reshape(logits.shape[0], tp.size * block)[:, :vocab_size]
        return sample(full, seeds, positions, temperature, top_k, top_p, vocab_limit)
    greedy = temperature == 0
    x = logits.float() if greedy else logits.float() / temperature  # (B, block)
    if vocab_valid < block:  # the padding columns of the last block
        x = x.masked_fill(torch.arange(block, device=x.device) >= vocab_valid, float("-inf"))
    lse = torch.logsumexp(x, dim=-1)  # (B,) over this block
    z = mask_unsampled(x, vocab_limit, offset=vocab_start)
    if not greedy:
        z = z + gumbel_noise(row_keys(seeds, positions), block, offset=vocab_start)
    best, idx = z.max(dim=-1)  # (B,)
    stats = torch.stack(
        [best.double(), lse.double(), x.gather(-1, idx[:, None])[:, 0].double(), (idx + vocab_start).double()], -1
    )
    every = all_gather(stats, tp)  # (tp, B, 4)
    winner = every[..., 0].argmax(0)  # (B,): the first rank holding the row's maximum
    pick = every.gather(0, winner[None, :, None].expand(1, -1, 4))[0]  # (B, 4)
    total_lse = torch.logsumexp(every[..., 1], dim=0)  # (B,) over the whole vocabulary
    return pick[:, 3].long(), (pick[:, 2] - total_lse).float()
