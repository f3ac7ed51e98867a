"""The native engine tensor-parallel on CPU (gloo, 2 and 4 processes) against itself at TP=1.

Tiny models with 4 query heads, 2 KV heads and a vocabulary of 49 (not divisible by 2 or 4: the
last vocabulary block is padded). At TP=4 each KV head is replicated on two ranks. The
`qwen2-padded` family's embedding has rows past the tokenizer's 49 ids that would win most draws:
rank 1's block [32, 64) holds real ids and padding rows, so a rank that masked by its local column
instead of the vocabulary id (offset + column) would draw them. Every rank of
the TP group must return the same tokens; greedy tokens equal TP=1's exactly, sampled tokens
(same seeds) too, and the log-probs agree with TP=1's and with the HF model's forward pass (the
trainer's log-probs of the same tokens) within 1e-5 (float32; the all-reduces sum partial
products in another order than one matmul).
"""

from __future__ import annotations

import pytest
import torch
from test_native_engine import TOK, engine_for, hf_model, prompts, trainer_log_probs
from tp_workers import CASES, FAMILIES, SAMPLED, generate_all, run_tp

from hybridrl.data import keys as K
from hybridrl.rollout.native.engine import NativeRolloutEngine


def _check_against_tp1(per_rank: list[dict], families: tuple, kv_heads: int) -> None:
    for family in families:
        model = hf_model(family)
        want = generate_all(engine_for(model))
        for r, res in enumerate(per_rank):
            got = res[family]
            assert got["sharded_load_equal"], (family, r)
            assert got["kv_heads"] == kv_heads, (family, r)
            for case in CASES:
                g, w = got[case], want[case]
                assert torch.equal(g[K.RESPONSES], per_rank[0][family][case][K.RESPONSES])  # the replica agrees
                assert int(g[K.RESPONSES][g[K.RESPONSE_MASK].bool()].max()) < len(TOK), (family, case, r)
                assert torch.equal(g[K.RESPONSES], w[K.RESPONSES]), (family, case, r)
                assert torch.equal(g[K.RESPONSE_MASK], w[K.RESPONSE_MASK]), (family, case, r)
                torch.testing.assert_close(g[K.ROLLOUT_LOG_PROBS], w[K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=0)
        sampled = per_rank[0][family]["sampled"]
        assert sampled[K.RESPONSE_MASK].sum() > 2 * len(prompts())  # real paths, not all EOS at once
        batch = prompts().repeat_interleave(SAMPLED.n)
        for k, v in sampled.items():
            batch[k] = v
        trainer = trainer_log_probs(model, batch, SAMPLED.temperature)
        torch.testing.assert_close(sampled[K.ROLLOUT_LOG_PROBS], trainer, atol=1e-5, rtol=0)


def test_tp2_equals_tp1(tmp_path):
    """TP=2 (one KV head per rank): greedy, sampled and top-k/top-p, five model families (one with padding rows)."""
    per_rank = run_tp(2, FAMILIES, tmp_path)
    _check_against_tp1(per_rank, FAMILIES, kv_heads=1)


def test_tp4_replicates_kv_heads_and_equals_tp1(tmp_path):
    """TP=4 with 2 KV heads: ranks 0-1 hold KV head 0, ranks 2-3 KV head 1; vocabulary blocks of 13 (the last 10)."""
    per_rank = run_tp(4, ("qwen2",), tmp_path)
    _check_against_tp1(per_rank, ("qwen2",), kv_heads=1)


def test_bad_tp_sizes_fail_clearly():
    from hybridrl.rollout.native.tp import TensorParallel

    model = hf_model("qwen2")
    with pytest.raises(ValueError, match="4 attention heads are not divisible by tensor_model_parallel_size=3"):
        NativeRolloutEngine(model.config, TOK, max_model_len=64, tp=TensorParallel(None, 0, 3))


def test_a_full_tensor_loaded_as_a_piece_fails_clearly():
    """A group of one process: slicing needs no collective, so the check runs in this process."""
    import torch.distributed as dist

    from hybridrl.rollout.native.tp import TensorParallel

    model = hf_model("qwen2")
    engine = NativeRolloutEngine(model.config, TOK, max_model_len=64, tp=TensorParallel(None, 1, 2))
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=r"is not TP rank 1/2's shard \(16, 32\) \(a full tensor passed with sharded=True\?\)"):
        engine.load_weights([(name, model.state_dict()[name])], sharded=True)
    engine.load_weights([(name, model.state_dict()[name])])  # full: rank 1 keeps query heads 2-3
    torch.testing.assert_close(engine.model.model.layers[0].self_attn.q_proj.weight, model.state_dict()[name][16:])
    assert not dist.is_initialized()
