"""The mixture-of-experts family (models/moe.py, moe_block.py) on CPU: grouped GEMMs against the
per-expert loop, the trainer's block against a float64 per-token reference written from the
formula, the adopted model against transformers' own Qwen3-MoE / Qwen2-MoE forward, the load-
balancing loss against HF's, and the checkpoint format on disk (one tensor per expert)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_models import tiny_moe

from hybridrl.models import moe, moe_block

VOCAB = 40


def _assignments(T=13, E=6, k=2, H=16, I=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g, dtype=dtype)
    ids = torch.stack([torch.randperm(E - 1, generator=g)[:k] for _ in range(T)])  # expert E-1 gets no token
    w = torch.rand(T, k, generator=g, dtype=dtype)
    gate_up = torch.randn(E, 2 * I, H, generator=g, dtype=dtype) / H**0.5
    down = torch.randn(E, H, I, generator=g, dtype=dtype) / I**0.5
    return x, ids, w, gate_up, down


def _per_token(x, ids, w, gate_up, down):
    """out[t] = sum_j w[t, j] down_e (silu(gate_e x_t) * up_e x_t), e = ids[t, j], token by token."""
    I = down.shape[-1]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = F.silu(gate_up[e, :I] @ x[t]) * (gate_up[e, I:] @ x[t])
            out[t] += w[t, j] * (down[e] @ h)
    return out


def test_grouped_gemm_and_the_expert_loop_agree_in_value_and_gradient():
    """Also `dense` (every expert over every token, weighted 0 where not routed: CUDA graphs in float32)."""
    x, ids, w, gate_up, down = _assignments()
    outs, grads = {}, {}
    for impl in ("grouped", "loop", "dense"):
        xs = [t.clone().requires_grad_(True) for t in (x, w, gate_up, down)]
        out = moe.expert_forward(xs[0], ids, xs[1], xs[2], xs[3], impl=impl)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        outs[impl], grads[impl] = out.detach(), [t.grad for t in xs]
    for impl in ("grouped", "dense"):
        torch.testing.assert_close(outs[impl], outs["loop"], atol=1e-5, rtol=1e-5)
        for a, b in zip(grads[impl], grads["loop"]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert float(grads["loop"][2][-1].abs().sum()) == 0  # the expert no token chose gets no gradient
    torch.testing.assert_close(outs["loop"], _per_token(x, ids, w, gate_up, down), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["grouped", "loop", "dense"])
def test_experts_split_over_shards_sum_to_the_whole(impl):
    """The engine's TP ranks each hold E / tp whole experts: the partial outputs add up."""
    x, ids, w, gate_up, down = _assignments(E=6)
    whole = moe.expert_forward(x, ids, w, gate_up, down, impl=impl)
    parts = sum(
        moe.expert_forward(x, ids, w, gate_up[r * 2 : r * 2 + 2], down[r * 2 : r * 2 + 2], first=r * 2, impl=impl)
        for r in range(3)
    )
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=1e-6)


def test_router_picks_the_top_k_and_renormalizes():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 2.5]])
    probs = moe.router_probs(logits)
    ids = moe.select_experts(probs, 2)
    assert ids.tolist() == [[1, 2], [0, 3]]
    w = moe.route_weights(probs, ids, norm_topk_prob=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    torch.testing.assert_close(w[0, 0] / w[0, 1], torch.tensor(1.0).exp())  # logits 2 and 1
    raw = moe.route_weights(probs, ids, norm_topk_prob=False)
    torch.testing.assert_close(raw, probs.gather(1, ids))
    replay = torch.tensor([[3, 0], [-1, -1]])  # row 0 replayed, row 1 routes itself
    assert moe.select_experts(probs, 2, replay).tolist() == [[3, 0], [0, 3]]


def _block_reference(block, x):
    """A sparse block's output from its weights, token by token in float64 (the formula, not the code)."""
    cfg = block.state.config
    gate_up, down = block.experts.gate_up_proj.detach(), block.experts.down_proj.detach()
    logits = x @ block.gate.weight.detach().T
    probs = torch.softmax(logits, -1)
    top, ids = probs.topk(cfg.num_experts_per_tok, -1)
    if cfg.norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    out = _per_token(x, ids, top, gate_up, down)
    if block.shared_expert is not None:
        s = block.shared_expert
        for t in range(x.shape[0]):
            h = F.silu(s.gate_proj.weight @ x[t]) * (s.up_proj.weight @ x[t])
            out[t] += torch.sigmoid(block.shared_expert_gate.weight @ x[t]) * (s.down_proj.weight @ h)
    return out


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_block_matches_a_per_token_float64_reference(family):
    model = tiny_moe(VOCAB, family=family, dtype=torch.float64)
    moe_block.adopt(model)
    block = model.model.layers[0].mlp
    assert isinstance(block, moe_block.SparseMoeBlock)
    x = torch.randn(2, 9, model.config.hidden_size, dtype=torch.float64)
    block.bind(None)
    got = block(x).reshape(-1, x.shape[-1])
    torch.testing.assert_close(got, _block_reference(block, x.reshape(-1, x.shape[-1])), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "family,extra",
    [
        ("qwen3_moe", {}),
        ("qwen3_moe", {"num_hidden_layers": 3, "mlp_only_layers": [1], "norm_topk_prob": False}),
        ("qwen3_moe", {"num_hidden_layers": 4, "decoder_sparse_step": 2}),
        ("qwen2_moe", {}),
    ],
)
def test_adopted_model_matches_transformers_forward(family, extra):
    """Our blocks (grouped GEMMs) against HF's own model (its per-expert loop) on the same weights:
    HF's router softmax is float32 even in float64, hence 1e-6."""
    hf = tiny_moe(VOCAB, family=family, dtype=torch.float64, **extra).eval()
    hf.config._experts_implementation = "eager"  # HF's loop (its grouped_mm path has no float64)
    ours = copy.deepcopy(hf)
    state = moe_block.adopt(ours)
    assert state.n_sparse == len(moe.sparse_layers(hf.config))
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in hf.named_parameters()]  # same names, same order
    ids = torch.randint(2, VOCAB, (3, 12))
    torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-6, rtol=0)


def test_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers():
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    assert moe.sparse_layers(cfg) == [1, 5]
    assert moe.sparse_layers(Qwen3MoeConfig(num_hidden_layers=3, num_experts=0)) == []


def test_load_balancing_loss_equals_transformers_for_one_layer():
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    logits = torch.randn(20, 8)
    probs = moe.router_probs(logits)
    ids = moe.select_experts(probs, 2)
    ours = moe.load_balancing_loss(probs, ids)
    torch.testing.assert_close(ours, load_balancing_loss_func((logits,), 8, 2))
    balanced = torch.zeros(4, 8)  # 4 tokens x 2 slots over 8 experts: one each
    torch.testing.assert_close(moe.load_balancing_loss(moe.router_probs(balanced), torch.arange(8).view(4, 2)), torch.tensor(2.0))
    mask = torch.tensor([1.0] * 10 + [0.0] * 10)
    torch.testing.assert_close(moe.load_balancing_loss(probs, ids, mask), moe.load_balancing_loss(probs[:10], ids[:10]))


def test_checkpoints_on_disk_hold_one_tensor_per_expert(tmp_path):
    """save_pretrained of an adopted model writes the per-expert layout of real Qwen3-MoE
    checkpoints, and a directory in that layout loads back into the fused experts."""
    from safetensors import safe_open

    from hybridrl.models.loading import load_causal_lm

    model = tiny_moe(VOCAB)
    moe_block.adopt(model)
    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        gate_3 = f.get_tensor("model.layers.1.mlp.experts.3.gate_proj.weight")
    assert "model.layers.0.mlp.experts.7.down_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    assert not any(n.endswith("gate_up_proj") for n in names)
    I = model.config.moe_intermediate_size
    assert torch.equal(gate_3, model.model.layers[1].mlp.experts.gate_up_proj[3, :I].detach())
    back = load_causal_lm(str(tmp_path))
    for (n, a), (_, b) in zip(model.named_parameters(), back.named_parameters()):
        assert torch.equal(a, b), n


class _CheckpointedCall(torch.nn.Module):
    """Activation checkpointing around a decoder layer's `__call__`, hooks included: what the
    transformers of the GPU image (5.17) do, where the pre-hook runs again inside the backward."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args, **kwargs):
        return torch.utils.checkpoint.checkpoint(self.layer, *args, use_reentrant=False, **kwargs)


@pytest.mark.parametrize("wrap", ["forward", "__call__"])
def test_activation_checkpointing_keeps_the_forwards_routing_replay_and_aux_loss(wrap):
    # The recompute runs after the pass has ended (the backward comes later): it must reuse the
    # forward's pass (the replayed experts, the load-balancing loss), so the gradients are those of
    # the run without checkpointing. On the GPU, HF's __call__-wrapping release hit a CheckpointError.
    from hybridrl.models.moe_block import RoutingPass, routing

    g = torch.Generator().manual_seed(int(torch.randint(0, 10_000, ())))
    ids = torch.randint(0, VOCAB, (2, 9), generator=g)
    grads = {}
    for checkpointed in (False, True):
        model = tiny_moe(VOCAB).train()
        state = moe_block.adopt(model)
        if checkpointed and wrap == "forward":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif checkpointed:
            layers = model.model.layers
            for i in range(len(layers)):
                layers[i] = _CheckpointedCall(layers[i])
        replay = torch.randint(
            0, state.n_experts, (ids.numel(), state.n_sparse, state.top_k), generator=torch.Generator().manual_seed(1)
        )
        replay[::2] = -1  # half the tokens route freshly
        p = RoutingPass(replay=replay, aux_weight=0.5)
        with routing(state, p):
            loss = model(ids, labels=ids).loss
        loss.backward()  # after the pass ended, as the trainer's loss does
        grads[checkpointed] = {
            n.replace(".layer.", "."): t.grad.clone() for n, t in model.named_parameters() if t.grad is not None
        }
    assert grads[True].keys() == grads[False].keys()
    router = [n for n in grads[False] if n.endswith("mlp.gate.weight")]
    assert router and all(grads[False][n].abs().sum() > 0 for n in router)
    for n, ref in grads[False].items():
        torch.testing.assert_close(grads[True][n], ref, atol=1e-6, rtol=1e-5, msg=n)
