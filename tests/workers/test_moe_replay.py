"""Router replay and the load-balancing loss in the trainer's passes (workers/moe_passes.py) on a
tiny Qwen3-MoE, CPU: a recorded routing replays exactly, also after the router moved, in packed
(shared prompts or not) and padded passes and under activation checkpointing; the aux loss adds
exactly coef x its gradient; the metrics count what the passes routed."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import tiny_moe

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models import moe_block
from hybridrl.workers import forward
from hybridrl.workers.engine import Split, TrainEngine

VOCAB = 40


def grpo_batch(prompts=3, n=3, P=7, R=6, seed=0) -> Batch:
    """`prompts` groups of `n` rows sharing a left-padded prompt, ragged right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    plen = torch.randint(2, P + 1, (prompts,), generator=g).repeat_interleave(n)
    rlen = torch.randint(1, R + 1, (prompts * n,), generator=g)
    B = prompts * n
    return Batch(
        {
            K.PROMPTS: torch.randint(2, VOCAB, (prompts, P), generator=g).repeat_interleave(n, 0),
            K.PROMPT_MASK: (torch.arange(P)[None] >= P - plen[:, None]).long(),
            K.RESPONSES: torch.randint(2, VOCAB, (B, R), generator=g),
            K.RESPONSE_MASK: (torch.arange(R)[None] < rlen[:, None]).float(),
            K.ADVANTAGES: torch.randn(B, R, generator=g),
        }
    )


def engine_of(model, *, packed=True, share=True, checkpointing=False, train=False) -> TrainEngine:
    engine = TrainEngine(torch.device("cpu"), "actor", forward.log_probs)
    engine.place(model, remove_padding=packed, share_prompts=share, checkpointing=checkpointing, train=train)
    return engine


def perturb_routers(model, scale=0.5, seed=1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, moe_block.SparseMoeBlock):
                m.gate.weight.add_(torch.randn(m.gate.weight.shape, generator=g) * scale)


def record(engine, batch, split=Split(4)):
    return forward.log_probs_and_routes(engine, engine.model, batch, split, 1.0)


def real_tokens(batch) -> torch.Tensor:
    return torch.cat([batch[K.PROMPT_MASK], batch[K.RESPONSE_MASK]], 1).bool()  # (B, T)


@pytest.mark.parametrize("packed,share", [(True, True), (True, False), (False, False)])
def test_replayed_routing_is_the_recorded_routing_after_the_router_moved(packed, share):
    batch = grpo_batch()
    engine = engine_of(tiny_moe(VOCAB), packed=packed, share=share)
    lp, routes = record(engine, batch)
    real = real_tokens(batch)
    L, k = engine.moe.state.n_sparse, engine.moe.state.top_k
    assert routes.shape == (*real.shape, L, k) and routes.dtype == torch.int16
    assert (routes[real] >= 0).all() and (routes[~real] == -1).all()

    perturb_routers(engine.model)
    _, own = record(engine, batch)  # the moved router routes differently...
    assert (own[real] != routes[real]).any()
    batch[K.ROUTED_EXPERTS] = routes
    engine.moe.replay = True
    lp_replayed, used = record(engine, batch)  # ...unless it replays
    assert torch.equal(used, routes)
    assert not torch.equal(lp_replayed, lp)  # the routing weights still come from the moved router


def test_recorded_routing_is_the_same_packed_shared_unshared_and_padded():
    batch = grpo_batch(seed=4)
    model = tiny_moe(VOCAB)
    layouts = ((True, True), (True, False), (False, False))
    got = [record(engine_of(copy.deepcopy(model), packed=p, share=s), batch)[1] for p, s in layouts]
    assert torch.equal(got[0], got[1]) and torch.equal(got[1], got[2])


def test_replay_survives_activation_checkpointing():
    """The backward re-runs each layer: with a replayed routing that is not the router's own, the
    gradients are those of the pass without checkpointing."""
    batch = grpo_batch(seed=2)
    model = tiny_moe(VOCAB)
    _, routes = record(engine_of(copy.deepcopy(model)), batch)
    perturb_routers(model, scale=1.0)
    batch[K.ROUTED_EXPERTS] = routes
    grads = []
    for checkpointing in (False, True):
        engine = engine_of(copy.deepcopy(model), checkpointing=checkpointing, train=True)
        engine.moe.replay = True
        micro = forward.pack_on_host(engine, batch, engine.device)
        log_prob, _, _ = engine.run(micro)
        (log_prob * batch[K.RESPONSE_MASK]).sum().backward()
        grads.append({n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=1e-6, rtol=1e-5, msg=n)


def test_load_balancing_loss_adds_coef_times_its_gradient():
    """The last sparse layer's router (no later layer's loss reaches it): its gradient with the
    loss on minus without is coef / L x d aux / d W, differentiated here from the pass's input."""
    from hybridrl.models import moe

    batch = grpo_batch(seed=5)
    base = tiny_moe(VOCAB)
    grads, inputs = {}, []
    for coef in (0.0, 0.25):
        engine = engine_of(copy.deepcopy(base), train=True)
        engine.moe.aux_coef = coef
        block = engine.model.model.layers[-1].mlp
        hook = block.register_forward_hook(lambda mod, args, out: inputs.append(args[0].detach().reshape(-1, args[0].shape[-1])))
        log_prob, _, _ = engine.run(forward.pack_on_host(engine, batch, engine.device))
        (log_prob * batch[K.RESPONSE_MASK]).sum().backward()
        hook.remove()
        grads[coef] = block.gate.weight.grad.clone()
    metrics = engine.moe.metrics()
    w = block.gate.weight.detach().clone().requires_grad_(True)
    probs = moe.router_probs(inputs[-1] @ w.T)
    aux = moe.load_balancing_loss(probs, moe.select_experts(probs, 2))
    (want,) = torch.autograd.grad(aux * 0.25 / 2, w)  # averaged over the 2 sparse layers
    torch.testing.assert_close(grads[0.25] - grads[0.0], want, atol=1e-6, rtol=1e-4)
    assert float(want.abs().max()) > 1e-4
    assert 1.0 <= metrics["moe/aux_loss"] <= 8.0 and metrics["moe/expert_load_max_over_mean"] >= 1.0
    assert {"moe/expert_load_max_over_mean/layer_0", "moe/expert_load_max_over_mean/layer_1", "moe/overflow_frac"} <= set(metrics)


def test_replay_mismatch_metric_counts_the_replayed_assignments_the_router_would_not_pick():
    batch = grpo_batch(seed=6)
    engine = engine_of(tiny_moe(VOCAB), train=True)
    _, routes = record(engine, batch)
    batch[K.ROUTED_EXPERTS] = routes
    engine.moe.replay = True
    for shift in (False, True):
        if shift:
            perturb_routers(engine.model, scale=2.0)
        micro = forward.pack_on_host(engine, batch, engine.device)
        engine.run(micro)[0].sum().backward()
        m = engine.moe.metrics()
        assert (m["moe/replay_mismatch_frac"] == 0.0) == (not shift), m
    assert 0 < m["moe/replay_mismatch_frac"] < 1
