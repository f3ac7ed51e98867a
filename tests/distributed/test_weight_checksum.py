"""The weight checksum (distributed/weight_checksum.py) against its Python-integer definition, and
the changes it must see: one element, two swapped elements, two tensors that trade names."""

from __future__ import annotations

import pytest
import torch

from hybridrl.distributed.weight_checksum import BLOCK, P, checksum, checksums, differing, reference_checksum, words

DTYPES = (torch.bfloat16, torch.float32, torch.float16, torch.float64, torch.int64, torch.uint8)


def _random(shape, dtype, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * 10).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**40)), min(info.max, 2**40), shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (37,), (5, 7, 3), (64, 33)])
@pytest.mark.parametrize("block,chunk", [(BLOCK, 2**24), (8, 32), (7, 7)])
def test_checksum_equals_the_integer_definition(dtype, shape, block, chunk):
    """Small blocks and chunks run the row, short-last-row and multi-chunk paths on small tensors."""
    t = _random(shape, dtype)
    got = checksum(t, block=block, chunk_elems=chunk)
    assert got.dtype == torch.int64 and got.tolist() == reference_checksum(t)
    assert all(0 <= s < P for s in got.tolist())


def test_checksum_of_a_tensor_over_one_block_and_a_strided_view():
    t = _random((3 * BLOCK + 11,), torch.bfloat16)
    assert checksum(t).tolist() == reference_checksum(t)
    m = _random((40, 30), torch.float32)
    assert checksum(m.t()).tolist() == reference_checksum(m.t().contiguous())  # bits in logical order


def test_reference_is_the_position_weighted_sum_of_16_bit_words():
    t = torch.tensor([1.0, -2.0], dtype=torch.bfloat16)  # bits 0x3F80, 0xC000
    w = [0x3F80, 0xC000 - 2**16]  # signed 16-bit words
    assert words(t).flatten().tolist() == w
    assert reference_checksum(t) == [(1 * w[0] + 2 * w[1]) % P]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_one_changed_element_anywhere_is_seen(dtype):
    t = _random((257,), dtype, seed=1)
    base = checksum(t, block=16, chunk_elems=64).tolist()
    for i in range(t.numel()):
        u = t.clone()
        u.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[i] ^= 1  # the lowest mantissa bit
        assert checksum(u, block=16, chunk_elems=64).tolist() != base, i


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_two_swapped_elements_are_seen(dtype):
    t = _random((300,), dtype, seed=2)
    base = checksum(t).tolist()
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        i, j = torch.randint(0, 300, (2,), generator=g).tolist()
        if torch.equal(t[i].view(-1), t[j].view(-1)):
            continue
        u = t.clone()
        u[i], u[j] = t[j], t[i]
        assert checksum(u).tolist() != base, (i, j)
    # swapped halves of one float32 (its two 16-bit words): each column sees it
    x = torch.tensor([1.5], dtype=torch.float32)
    w = x.view(torch.int16).flip(0).view(torch.float32)
    assert checksum(w).tolist() != checksum(x).tolist()


def test_tensors_that_trade_names_or_transpose_are_seen():
    a, b = _random((8, 8), torch.float32, 4), _random((8, 8), torch.float32, 5)
    sent = checksums([("q", a), ("k", b)])
    assert differing(sent, checksums([("q", a), ("k", b)])) == []
    assert differing(sent, checksums([("q", b), ("k", a)])) == ["q", "k"]
    assert differing(sent, checksums([("q", a.t().contiguous()), ("k", b)])) == ["q"]
    assert differing(sent, checksums([("q", a)])) == ["k"]  # not held at all


def test_same_bits_same_checksum_whatever_the_values_say():
    """Bits, not values: -0.0 and 0.0 differ; NaNs of the same bits agree."""
    assert checksum(torch.tensor([0.0])).tolist() != checksum(torch.tensor([-0.0])).tolist()
    nan = torch.tensor([float("nan"), 1.0])
    assert checksum(nan).tolist() == checksum(nan.clone()).tolist()
