"""Token-budget micro-batches (`use_dynamic_bsz`): split by tokens, not by sequence count.

With ragged RL batches a fixed number of sequences per micro-batch is either wasteful (short
responses) or out of memory (long ones). Instead every micro-batch gets at most
`max_tokens` real tokens (prompt + response, padding excluded, which is what a packed forward
computes), and the micro-batches are balanced: the fewest that fit the budget, filled by
longest-first greedy assignment to the lightest micro-batch (LPT; within 4/3 of the optimum).
Outputs are restored to the original row order with `restore_order`.

The same partition balances a batch over data-parallel ranks (`balance_across_ranks`), so each
rank gets about the same number of tokens.
"""

from __future__ import annotations

import heapq
import math

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch


def sequence_lengths(batch: Batch) -> torch.Tensor:
    """Real tokens per row (prompt + response, no padding): (B,) int64."""
    response = batch[K.RESPONSE_ATTENTION_MASK] if K.RESPONSE_ATTENTION_MASK in batch else batch[K.RESPONSE_MASK]
    return batch[K.PROMPT_MASK].sum(-1).long() + response.sum(-1).long()


def _lpt(lengths: list[int], parts: int) -> list[list[int]]:
    """Longest first, each into the currently lightest part; returns index lists in row order."""
    heap = [(0, p) for p in range(parts)]
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        load, p = heapq.heappop(heap)
        out[p].append(i)
        heapq.heappush(heap, (load + lengths[i], p))
    return [sorted(part) for part in out if part]


def partition_by_tokens(lengths, max_tokens: int, min_parts: int = 1, what: str = "max_token_len_per_gpu") -> list[list[int]]:
    """Split rows into the fewest balanced groups of at most `max_tokens` tokens each.

    `min_parts` forces at least that many groups (e.g. the same micro-batch count on every
    data-parallel rank, which FSDP's collectives need). Raises if one row alone is over budget.
    """
    lengths = [int(x) for x in lengths]
    if not lengths:
        return []
    longest = max(lengths)
    if longest > max_tokens:
        raise ValueError(
            f"a sequence of {longest} tokens (prompt + response) does not fit {what}={max_tokens}; raise {what} to at "
            f"least {longest} (data.max_prompt_length + data.max_response_length is always enough)"
        )
    parts = max(min_parts, math.ceil(sum(lengths) / max_tokens))
    while True:
        groups = _lpt(lengths, min(parts, len(lengths)))
        if all(sum(lengths[i] for i in g) <= max_tokens for g in groups):
            return groups
        parts += 1


def balance_across_ranks(lengths, world_size: int) -> list[list[int]]:
    """Equal-count groups of rows for `world_size` ranks with balanced token sums (LPT among the
    groups that still have room); rank r takes rows `groups[r]`."""
    lengths = [int(x) for x in lengths]
    if len(lengths) % world_size:
        raise ValueError(f"{len(lengths)} rows cannot be split evenly over {world_size} ranks")
    cap = len(lengths) // world_size
    loads, out = [0] * world_size, [[] for _ in range(world_size)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min((r for r in range(world_size) if len(out[r]) < cap), key=lambda r: loads[r])
        out[r].append(i)
        loads[r] += lengths[i]
    return [sorted(g) for g in out]


def partition_by_prompt(
    lengths, prompt_lens, first, max_tokens: int, min_parts: int = 1, what: str = "max_token_len_per_gpu"
) -> list[list[int]]:
    """`partition_by_tokens` for packed passes that share prompts (`models/packing.pack`): rows
    with the same prompt (`first`: each row's first row with that prompt) stay in one group,
    which costs the prompt once plus every response, so they are computed together; a group
    over the budget is cut into pieces that fit. Falls back to single rows when `min_parts`
    asks for more groups than there are pieces."""
    lengths, prompt_lens, first = [int(x) for x in lengths], [int(x) for x in prompt_lens], [int(x) for x in first]
    members: dict[int, list[int]] = {}
    for i, f in enumerate(first):
        members.setdefault(f, []).append(i)
    units, costs = [], []
    for rows in members.values():
        unit, cost = [], 0
        for i in rows:
            add = lengths[i] - prompt_lens[i] if unit else lengths[i]
            if unit and cost + add > max_tokens:
                units.append(unit)
                costs.append(cost)
                unit, cost, add = [], 0, lengths[i]
            unit.append(i)
            cost += add
        units.append(unit)
        costs.append(cost)
    if min_parts > len(units):
        return partition_by_tokens(lengths, max_tokens, min_parts, what)
    parts = partition_by_tokens(costs, max_tokens, min_parts, what)
    return [sorted(i for u in part for i in units[u]) for part in parts]


def first_of_prompt(prompts: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """For each row of left-padded prompts (b, P): the first row with the same prompt, (b,)."""
    b = prompts.shape[0]
    _, inverse = torch.unique(prompts.masked_fill(~prompt_mask.bool(), -1), dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1 if b else 0,), b, dtype=torch.long, device=prompts.device)
    return first.scatter_reduce(0, inverse, torch.arange(b, device=prompts.device), "amin")[inverse]


def micro_batches(
    batch: Batch,
    *,
    micro_size: int,
    dynamic: bool,
    max_tokens: int,
    what: str,
    min_parts: int = 1,
    share_prompts: bool = False,
) -> tuple[list[Batch], list[int]]:
    """The micro-batches of `batch` and the row order they come in (concatenated).

    Fixed: consecutive chunks of `micro_size` rows. Dynamic: token-budget groups; with
    `share_prompts`, rows that repeat a prompt kept together and its tokens counted once.
    """
    if not dynamic:
        return batch.split(micro_size), list(range(len(batch)))
    lengths = sequence_lengths(batch).tolist()
    if share_prompts:
        prompt_lens = batch[K.PROMPT_MASK].sum(-1).tolist()
        first = first_of_prompt(batch[K.PROMPTS], batch[K.PROMPT_MASK]).tolist()
        groups = partition_by_prompt(lengths, prompt_lens, first, max_tokens, min_parts, what)
    else:
        groups = partition_by_tokens(lengths, max_tokens, min_parts, what)
    return [batch.index(g) for g in groups], [i for g in groups for i in g]


def restore_order(values: torch.Tensor, order: list[int]) -> torch.Tensor:
    """Rows computed in `order` (concatenated micro-batch outputs) back in the original order."""
    out = torch.empty_like(values)
    out[torch.as_tensor(order, dtype=torch.long)] = values
    return out
