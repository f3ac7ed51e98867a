"""The padded layout the CUDA-graphed passes run on (`hybridrl.models.graphs`): the buckets, and
that the decoder on padded inputs gives the packed pass's hidden states and gradients exactly
(float64, CPU, the sdpa packed backend). The graphs themselves: tests/gpu/test_graphs_gpu.py."""

import pytest
import torch
from graph_helpers import grouped_rows, tiny_qwen2

from hybridrl.models import graphs
from hybridrl.models.packing import enable_packing, pack, packed_hidden


def test_buckets_round_up_by_at_most_a_sixteenth_and_stay_few():
    for n in [1, 255, 256, 257, 1000, 4097, 8600, 24_576, 65_535, 65_537]:
        b = graphs.bucket(n)
        assert b >= n and b >= graphs.PAD_SEQ
        assert b <= max(graphs.PAD_SEQ, n + n // 16)
    sizes = {graphs.bucket(n) for n in range(16_385, 32_769)}
    assert sizes == set(range(17_408, 32_769, 1_024))  # one per 1,024 tokens in (16k, 32k]


def _model():
    model = tiny_qwen2(vocab=60, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2).double()
    enable_packing(model, "sdpa", torch.device("cpu"))
    return model


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_padded_inputs_give_the_packed_hidden_states_and_gradients(share, seed):
    model = _model()
    decoder = model.get_decoder()
    packed = pack(*grouped_rows(seed, groups=3, n=4, P=40, R=300, vocab=60), share_prompts=share)
    assert (packed.prompt_gather is not None) == share
    shape = graphs.plan(packed, grad=True)
    assert shape.n >= packed.num_tokens and shape.v >= packed.attn_tokens
    inputs = graphs.padded_inputs(packed, shape)
    assert inputs["ids"].shape == (shape.n,) and inputs["cu"].shape == (shape.seqs + 1,)
    assert int(inputs["cu"][-1]) == shape.v and bool((inputs["cu"].diff() >= 0).all())
    assert int(inputs["cu"].diff().max()) <= shape.max_len
    if share:
        assert inputs["gather"].shape == (shape.v,) and inputs["take"].shape == (shape.n,)

    params = list(decoder.parameters())
    w = torch.randn(packed.target_index.shape[0], 32, dtype=torch.float64)
    ref = packed_hidden(decoder, packed)
    g_ref = torch.autograd.grad((ref * w).sum(), params)

    embeds = decoder.get_input_embeddings()(inputs["ids"])[None]
    out = graphs.run_decoder(decoder, embeds, inputs, shape.max_len)[0, packed.target_index]
    g_out = torch.autograd.grad((out * w).sum(), params)
    # through fresh leaves over the parameters' storage, as the capture runs it
    leaves = {n: p.detach().requires_grad_() for n, p in decoder.named_parameters()}
    out2 = graphs.run_decoder(decoder, embeds.detach(), inputs, shape.max_len, leaves)[0, packed.target_index]
    g_leaves = torch.autograd.grad((out2 * w).sum(), [leaves[n] for n, _ in decoder.named_parameters()], allow_unused=True)
    assert torch.equal(out2, out)
    for (name, _), a, b in zip(decoder.named_parameters(), g_leaves, g_out):
        if name == "embed_tokens.weight":  # the embeddings came in detached: their gradient is the eager lookup's
            assert a is None
        else:
            assert torch.equal(a, b), name
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_graphs_stay_off_where_they_cannot_run(capsys):
    model = _model()
    decoder = model.get_decoder()
    assert graphs.enable(model, decoder, torch.device("cpu"), "sdpa") is None
    assert "CUDA only" in capsys.readouterr().out
    assert graphs.runner(decoder) is None
    reason = graphs.why_not(model, decoder, torch.device("cuda"), "flex")
    assert "varlen" in reason
