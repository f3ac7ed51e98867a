import numpy as np
import pytest
import torch

from hybridrl.data.batch import Batch


def make(n=6):
    return Batch({"x": torch.arange(n * 2).view(n, 2)}, {"s": [f"r{i}" for i in range(n)]}, {"m": 1})


def test_split_concat_roundtrip():
    b = make(7)
    parts = b.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    back = Batch.concat(parts)
    assert torch.equal(back["x"], b["x"]) and list(back["s"]) == list(b["s"])


def test_chunk_requires_divisible_and_pad_fixes_it():
    b = make(7)
    with pytest.raises(ValueError, match="pad the batch first"):
        b.chunk(2)
    padded, pad = b.pad_to_multiple(4)
    assert pad == 1 and len(padded) == 8
    assert torch.equal(padded["x"][7], b["x"][0])  # padding repeats leading rows
    assert [len(c) for c in padded.chunk(4)] == [2, 2, 2, 2]


def test_repeat_interleave_keeps_samples_of_a_prompt_adjacent():
    b = make(2).repeat_interleave(3)
    assert list(b["s"]) == ["r0", "r0", "r0", "r1", "r1", "r1"]
    assert torch.equal(b["x"][:, 0], torch.tensor([0, 0, 0, 2, 2, 2]))


def test_index_reorders_tensors_and_non_tensors_together():
    b = make(4).index([3, 1])
    assert list(b["s"]) == ["r3", "r1"]
    assert torch.equal(b["x"], torch.tensor([[6, 7], [2, 3]]))


def test_length_mismatch_and_missing_key_are_errors():
    with pytest.raises(ValueError, match="different lengths"):
        Batch({"x": torch.zeros(3)}, {"s": ["a", "b"]})
    b = make(2)
    with pytest.raises(KeyError, match="no field 'nope'"):
        b["nope"]
    with pytest.raises(KeyError):
        b.select(["x", "nope"])


def test_non_tensor_dicts_survive():
    b = Batch({"x": torch.zeros(2)}, {"d": [{"a": 1}, {"b": 2}]})
    assert b.index([1])["d"][0] == {"b": 2}
    assert isinstance(b["d"], np.ndarray)
