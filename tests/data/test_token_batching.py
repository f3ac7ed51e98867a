import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import (
    balance_across_ranks,
    micro_batches,
    partition_by_prompt,
    partition_by_tokens,
    restore_order,
    sequence_lengths,
)
from hybridrl.models.packing import pack


def test_partition_fits_budget_uses_fewest_parts_and_balances():
    lengths = [900, 100, 500, 500, 300, 700, 50, 950]  # 4000 tokens
    groups = partition_by_tokens(lengths, 1000)
    assert sorted(i for g in groups for i in g) == list(range(8))
    sums = [sum(lengths[i] for i in g) for g in groups]
    assert max(sums) <= 1000
    assert len(groups) == 4  # ceil(4000 / 1000): the minimum
    assert all(g == sorted(g) for g in groups)  # rows keep their order inside a micro-batch


def test_partition_min_parts_and_small_inputs():
    assert len(partition_by_tokens([10, 10, 10, 10], 100, min_parts=3)) == 3
    assert partition_by_tokens([5], 5) == [[0]]
    assert partition_by_tokens([], 5) == []


def test_partition_rejects_a_sequence_over_budget_with_the_key_to_change():
    with pytest.raises(ValueError, match=r"1200 tokens .* actor.ppo_max_token_len_per_gpu=1000"):
        partition_by_tokens([100, 1200], 1000, what="actor.ppo_max_token_len_per_gpu")


def test_balance_across_ranks_equal_counts_balanced_tokens():
    lengths = [100, 90, 80, 70, 10, 20, 30, 40]
    groups = balance_across_ranks(lengths, 2)
    assert [len(g) for g in groups] == [4, 4]
    sums = [sum(lengths[i] for i in g) for g in groups]
    assert abs(sums[0] - sums[1]) <= 20


def test_micro_batches_restore_the_original_order():
    g = torch.Generator().manual_seed(0)
    n, P, R = 9, 4, 6
    resp_len = torch.randint(1, R + 1, (n,), generator=g)
    batch = Batch(
        {
            K.PROMPTS: torch.zeros(n, P, dtype=torch.long),
            K.PROMPT_MASK: torch.ones(n, P, dtype=torch.long),
            K.RESPONSES: torch.arange(n)[:, None].repeat(1, R),
            K.RESPONSE_MASK: (torch.arange(R)[None] < resp_len[:, None]).float(),
        }
    )
    assert sequence_lengths(batch).tolist() == (P + resp_len).tolist()
    micros, order = micro_batches(batch, micro_size=2, dynamic=True, max_tokens=20, what="x")
    assert all(int(sequence_lengths(m).sum()) <= 20 for m in micros)
    out = torch.cat([m[K.RESPONSES].float() for m in micros])
    assert torch.equal(restore_order(out, order), batch[K.RESPONSES].float())
    fixed, order = micro_batches(batch, micro_size=4, dynamic=False, max_tokens=0, what="x")
    assert [len(m) for m in fixed] == [4, 4, 1] and order == list(range(n))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_shared_prompt_micro_batches_keep_groups_and_fit_the_budget_as_packed(seed):
    """GRPO-shaped batches (groups of n rows with one prompt, shuffled): each micro-batch holds
    whole groups unless a group alone is over budget, and what `pack` computes for it (the
    prompt once) fits the budget; every row appears once and the order restores."""
    g = torch.Generator().manual_seed(seed)
    groups, n, P, R = 6, 5, 12, 10
    prompt_lens = torch.randint(1, P + 1, (groups,), generator=g).repeat_interleave(n)
    prompts = torch.randint(2, 50, (groups, P), generator=g).repeat_interleave(n, 0)
    prompt_mask = (torch.arange(P)[None] >= P - prompt_lens[:, None]).long()
    resp_len = torch.randint(1, R + 1, (groups * n,), generator=g)
    perm = torch.randperm(groups * n, generator=g)
    batch = Batch(
        {
            K.PROMPTS: prompts * prompt_mask,
            K.PROMPT_MASK: prompt_mask,
            K.RESPONSES: torch.randint(2, 50, (groups * n, R), generator=g),
            K.RESPONSE_MASK: (torch.arange(R)[None] < resp_len[:, None]).float(),
        }
    ).index(perm)
    budget = 60
    micros, order = micro_batches(batch, micro_size=1, dynamic=True, max_tokens=budget, what="x", share_prompts=True)
    assert sorted(order) == list(range(groups * n))
    group_of = {int(i): int(perm[i]) // n for i in range(groups * n)}  # batch row -> its group
    parts_of = {}
    for k, (m, rows) in enumerate(zip(micros, _chunks(order, [len(m) for m in micros]))):
        packed = pack(m[K.PROMPTS], m[K.PROMPT_MASK], m[K.RESPONSES], m[K.RESPONSE_MASK], share_prompts=True)
        assert packed.num_tokens <= budget
        for r in rows:
            parts_of.setdefault(group_of[r], set()).add(k)
    for grp, parts in parts_of.items():  # a group is split only when it alone is over budget
        rows = [r for r in range(groups * n) if group_of[r] == grp]
        whole = int(batch[K.PROMPT_MASK][rows[0]].sum()) + int(batch[K.RESPONSE_MASK][rows].sum())
        assert len(parts) == 1 or whole > budget
    # fewer micro-batches than counting every prompt n times
    assert len(micros) <= len(micro_batches(batch, micro_size=1, dynamic=True, max_tokens=budget, what="x")[0])
    out = torch.cat([m[K.RESPONSES] for m in micros])
    assert torch.equal(restore_order(out, order), batch[K.RESPONSES])


def _chunks(seq, sizes):
    out, i = [], 0
    for s in sizes:
        out.append(seq[i : i + s])
        i += s
    return out


def test_partition_by_prompt_cuts_an_oversized_group_and_honours_min_parts():
    # one prompt of 4 tokens, 6 rows of 4 + 6 tokens: 4 + 36 = 40 tokens shared
    lengths, prompt_lens, first = [10] * 6, [4] * 6, [0] * 6
    parts = partition_by_prompt(lengths, prompt_lens, first, max_tokens=20, what="x")
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert all(4 + 6 * len(p) <= 20 for p in parts) and len(parts) == 3  # 4 + 6 + 6 = 16 per part
    assert len(partition_by_prompt(lengths, prompt_lens, first, max_tokens=100, what="x")) == 1
    # more parts asked than pieces: single rows, the unshared partition
    assert len(partition_by_prompt(lengths, prompt_lens, first, max_tokens=100, min_parts=4, what="x")) == 4
