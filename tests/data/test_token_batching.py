import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import balance_across_ranks, micro_batches, partition_by_tokens, restore_order, sequence_lengths


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
