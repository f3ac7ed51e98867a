"""The native engine on mixtures of experts, CPU (tiny Qwen3-MoE / Qwen2-MoE, float32): sampled
log-probs equal the HF forward's (the dense path's 1e-5), per-expert checkpoint names load, the
routing it records (router replay R3) is what it routed through every mode of the loop (multi-step
launches, prefix caching, chunked prefill), the trainer replaying it routes exactly as the engine
did after its routers moved, and TP=2 (E / 2 whole experts per rank) equals TP=1."""

from __future__ import annotations

import copy

import pytest
import torch
from test_native_engine import TOK, engine_for, hf_model, prompts, trainer_log_probs
from tp_workers import CASES, SAMPLED, generate_all, run_tp

from hybridrl.data import keys as K
from hybridrl.models import moe_block
from hybridrl.rollout.native.engine import NativeRolloutEngine
from hybridrl.workers import forward
from hybridrl.workers.engine import Split, TrainEngine

MOE = ("qwen3_moe", "qwen2_moe")
LONG = ["1+2=", "13+41=", "7*8=", "(2+3)*4=", "99-1=", "(12+34)*56-78=(9*8)+1="]


def _trainer(model) -> TrainEngine:
    engine = TrainEngine(torch.device("cpu"), "actor", forward.log_probs)
    engine.place(copy.deepcopy(model), remove_padding=True, share_prompts=True, train=False)
    return engine


@pytest.mark.parametrize(
    "family,impl", [("qwen3_moe", "auto"), ("qwen2_moe", "auto"), ("qwen3_moe", "grouped"), ("qwen3_moe", "dense")]
)
def test_sampled_log_probs_equal_the_hf_forward(family, impl):
    """auto is the expert loop on CPU; grouped is the decode graph's path in bf16 on CUDA, dense in float32."""
    model = hf_model(family)
    engine = engine_for(model)
    for layer in engine.model.moe_layers():
        layer.impl = impl
    out = engine.generate(prompts(), SAMPLED, seeds=list(range(10)))
    assert out[K.RESPONSE_MASK].sum() > 2 * len(prompts())
    torch.testing.assert_close(out[K.ROLLOUT_LOG_PROBS], trainer_log_probs(model, out, SAMPLED.temperature), atol=1e-5, rtol=0)


def test_per_expert_checkpoint_names_load_into_the_fused_experts():
    """The layout of Qwen3-MoE checkpoints on disk: one gate/up/down matrix per expert."""
    model = hf_model("qwen3_moe")
    I = model.config.moe_intermediate_size
    per_expert = []
    for name, p in model.named_parameters():
        if name.endswith("experts.gate_up_proj"):
            stem = name[: -len("gate_up_proj")]
            per_expert += [(f"{stem}{e}.gate_proj.weight", p[e, :I]) for e in range(p.shape[0])]
            per_expert += [(f"{stem}{e}.up_proj.weight", p[e, I:]) for e in range(p.shape[0])]
        elif name.endswith("experts.down_proj"):
            per_expert += [(f"{name[: -len('down_proj')]}{e}.down_proj.weight", p[e]) for e in range(p.shape[0])]
        else:
            per_expert.append((name, p))
    fresh = NativeRolloutEngine(model.config, TOK, max_model_len=64, block_size=4)
    fresh.load_weights(per_expert)
    fused = engine_for(model, share_weights=False)
    for (n, a), (_, b) in zip(fresh.model.state_dict().items(), fused.model.state_dict().items()):
        assert torch.equal(a, b), n
    with pytest.raises(KeyError, match="no parameter 'model.layers.0.mlp.experts.0.gate_proj.bias'"):
        fresh.load_weights([("model.layers.0.mlp.experts.0.gate_proj.bias", torch.zeros(I))])


@pytest.mark.parametrize(
    "kw",
    [{}, {"decode_steps_per_sync": 3}, {"prefix_caching": True}, {"chunked_prefill": True, "max_num_batched_tokens": 8}],
    ids=["plain", "multistep", "prefix_cache", "chunked"],
)
def test_recorded_routing_is_the_routing_the_trainer_computes(kw):
    """Every token the engine ran through the model has its experts recorded (all but maybe each
    response's last token; prompt tokens taken from the prefix cache are not recomputed), and
    they are the trainer's own top-k at the same weights."""
    model = hf_model("qwen3_moe")
    texts = LONG if kw else LONG[:5]
    batch = prompts(texts)
    if kw.get("prefix_caching"):  # a shared first block: the later prompts find it cached
        batch = prompts(["(12+34)*5=" + t for t in texts[:3]])
    out = engine_for(model, record_routing=True, **kw).generate(batch, SAMPLED, seeds=list(range(2 * len(batch))))
    routes = out[K.ROUTED_EXPERTS]
    real = torch.cat([out[K.PROMPT_MASK], out[K.RESPONSE_MASK]], 1).bool()
    assert routes.shape == (*real.shape, 2, 2) and routes.dtype == torch.int16
    assert (routes[~real] == K.NO_EXPERT).all()
    recorded = routes[..., 0, 0] >= 0
    last = torch.zeros_like(real)
    last[torch.arange(len(out)), out[K.PROMPTS].shape[1] + out[K.RESPONSE_MASK].sum(1).long() - 1] = True
    if not kw.get("prefix_caching"):
        assert torch.equal(recorded | last, real)  # everything the engine ran (the last tokens at most by wasted steps)
    else:
        assert (~recorded & real & ~last).any() and (recorded & real).any()
    _, own = forward.log_probs_and_routes(_trainer(model), None, out, Split(4), 1.0)
    assert torch.equal(own[recorded], routes[recorded])


def test_replay_routes_the_trainer_as_the_engine_did_after_the_routers_moved():
    model = hf_model("qwen3_moe")
    out = engine_for(model, record_routing=True).generate(prompts(LONG[:5]), SAMPLED, seeds=list(range(10)))
    routes = out[K.ROUTED_EXPERTS]
    recorded = routes >= 0
    trainer = _trainer(model)
    with torch.no_grad():  # logits perturbed: the routers disagree with the engine's
        for m in trainer.model.modules():
            if isinstance(m, moe_block.SparseMoeBlock):
                m.gate.weight.add_(torch.randn_like(m.gate.weight))
    _, own = forward.log_probs_and_routes(trainer, trainer.model, out, Split(4), 1.0)
    assert (own[recorded] != routes[recorded]).float().mean() > 0.1
    trainer.moe.replay = True
    _, replayed = forward.log_probs_and_routes(trainer, trainer.model, out, Split(4), 1.0)
    assert torch.equal(replayed[recorded], routes[recorded])


def test_recording_a_dense_model_fails_clearly():
    with pytest.raises(ValueError, match="router replay R3 records a mixture of experts' routing, and LlamaForCausalLM"):
        engine_for(hf_model("llama"), record_routing=True)


@pytest.mark.slow
def test_tp2_holds_half_the_experts_per_rank_and_equals_tp1(tmp_path):
    per_rank = run_tp(2, MOE, tmp_path)
    for family in MOE:
        want = generate_all(engine_for(hf_model(family)))
        for r, res in enumerate(per_rank):
            assert res[family]["sharded_load_equal"], (family, r)
            for case in CASES:
                g, w = res[family][case], want[case]
                assert torch.equal(g[K.RESPONSES], w[K.RESPONSES]), (family, case, r)
                torch.testing.assert_close(g[K.ROLLOUT_LOG_PROBS], w[K.ROLLOUT_LOG_PROBS], atol=1e-5, rtol=0)


def test_tp_sizes_that_split_experts_unevenly_fail_clearly():
    from hybridrl.rollout.native.tp import TensorParallel

    cfg = hf_model("qwen3_moe").config
    cfg.num_experts = 6
    with pytest.raises(ValueError, match="num_experts 6 is not divisible by tensor_model_parallel_size=4; sizes .*: 1, 2"):
        NativeRolloutEngine(cfg, TOK, max_model_len=64, tp=TensorParallel(None, 0, 4))


def test_lora_policy_merged_into_the_engine_samples_what_the_trainer_scores():
    """LoRA on a mixture of experts (peft's all-linear: attention and, Qwen2-MoE, the shared expert;
    the router and the fused experts are no nn.Linear, as in HF): the merged weights the engine
    loads give the trainer's packed log-probs of the adapted policy."""
    from hybridrl.models import lora

    model = lora.apply_lora(hf_model("qwen2_moe"), 4, 8, "all-linear")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    adapted = {n.split(".base_layer")[0] for n, _ in model.named_parameters() if ".base_layer." in n}
    assert any("shared_expert." in n for n in adapted) and not any(n.endswith(("mlp.gate", "experts")) for n in adapted)
    engine = NativeRolloutEngine(model.config, TOK, max_model_len=64, block_size=4)
    engine.load_weights(lora.merged_named_parameters(model))
    out = engine.generate(prompts(), SAMPLED, seeds=list(range(10)))
    trainer = TrainEngine(torch.device("cpu"), "actor", forward.log_probs)
    trainer.place(model, remove_padding=True, share_prompts=True, train=False)
    want = forward.token_log_probs(trainer, trainer.model, out, Split(4), SAMPLED.temperature)
    torch.testing.assert_close(out[K.ROLLOUT_LOG_PROBS], want, atol=1e-5, rtol=0)
