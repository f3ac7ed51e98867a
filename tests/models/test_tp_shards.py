"""The TP shard spec: the ranks' pieces tile each parameter exactly (or replicate it), by hand-worked slices."""

from types import SimpleNamespace

import pytest
import torch

from hybridrl.models.tp_shards import Slice, check_tp, shard, shard_bytes, tp_slice


def cfg(heads=4, kv=2, hidden=64, inter=256):
    return SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv, hidden_size=hidden, intermediate_size=inter)


def test_hand_worked_slices():
    c = cfg()  # head_dim 16
    assert tp_slice("model.layers.0.self_attn.q_proj.weight", (64, 64), c, 1, 2) == Slice(0, 32, 64)
    assert tp_slice("model.layers.0.self_attn.k_proj.bias", (32,), c, 1, 2) == Slice(0, 16, 32)
    assert tp_slice("model.layers.0.self_attn.o_proj.weight", (64, 64), c, 0, 2) == Slice(1, 0, 32)
    assert tp_slice("model.layers.0.self_attn.o_proj.bias", (64,), c, 0, 2) is None
    assert tp_slice("model.layers.0.mlp.down_proj.weight", (64, 256), c, 1, 2) == Slice(1, 128, 256)
    assert tp_slice("model.layers.0.mlp.up_proj.weight", (256, 64), c, 1, 2) == Slice(0, 128, 256)
    assert tp_slice("model.layers.0.input_layernorm.weight", (64,), c, 1, 2) is None
    # vocab 10 over 4 ranks: blocks of 3, the last one short
    assert [tp_slice("model.embed_tokens.weight", (10, 64), c, r, 4) for r in range(4)] == [
        Slice(0, 0, 3),
        Slice(0, 3, 6),
        Slice(0, 6, 9),
        Slice(0, 9, 10),
    ]
    # 2 KV heads at TP=4: heads 0,0,1,1
    assert [tp_slice("model.layers.0.self_attn.v_proj.weight", (32, 64), c, r, 4) for r in range(4)] == [
        Slice(0, 0, 16),
        Slice(0, 0, 16),
        Slice(0, 16, 32),
        Slice(0, 16, 32),
    ]


@pytest.mark.parametrize("tp", [2, 4])
def test_column_and_row_pieces_tile_the_tensor(tp):
    c = cfg(heads=8, kv=4, hidden=64, inter=128)
    g = torch.Generator().manual_seed(tp)
    for name, shape, dim in [
        ("a.q_proj.weight", (64, 64), 0),
        ("a.down_proj.weight", (64, 128), 1),
        ("lm_head.weight", (37, 64), 0),
    ]:
        full = torch.randn(shape, generator=g, dtype=torch.float64)
        pieces = [shard(name, full, c, r, tp) for r in range(tp)]
        assert torch.equal(torch.cat(pieces, dim), full)
        assert sum(shard_bytes(name, shape, 8, c, r, tp) for r in range(tp)) == full.numel() * 8


def test_check_tp_names_a_size_that_works():
    assert check_tp(cfg(), 1) is None and check_tp(cfg(), 2) is None and check_tp(cfg(), 4) is None
    msg = check_tp(cfg(heads=14, kv=2, inter=4864), 4)
    assert "14 attention heads" in msg and msg.endswith("sizes that work for this model: 1, 2")
    assert "key/value heads" in check_tp(cfg(heads=12, kv=3, inter=96), 4 if 12 % 4 == 0 else 2)
