"""Multi-turn rollouts of a mixture of experts with router replay R3: the routing of the tokens a
tool wrote (prefilled by the extend pass that resumes the sequence) is recorded too, and every
recorded entry is the trainer's own top-k at the same weights."""

from __future__ import annotations

import torch
from agent_helpers import TOK
from test_agent_loop import CALL, run, turn
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from hybridrl.data import keys as K
from hybridrl.workers import forward
from hybridrl.workers.engine import Split, TrainEngine


def tiny_moe():
    cfg = dict(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_experts=8)
    cfg.update(num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    cfg.update(head_dim=8, max_position_embeddings=1024, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**cfg, tie_word_embeddings=False)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1.0 if "embed" in name else p.shape[-1] ** -0.5)
    return model


def test_tool_tokens_routing_is_recorded_and_is_the_trainers():
    plans = {11: [turn(CALL, free=2), turn("#### 5")], 12: [turn(free=3)]}
    model = tiny_moe()
    out, _, _, _ = run(plans, model=model, engine={"record_routing": True})
    routes = out[K.ROUTED_EXPERTS]
    P = out[K.PROMPTS].shape[1]
    context = out[K.RESPONSE_ATTENTION_MASK].bool()
    tool = context & ~out[K.RESPONSE_MASK].bool()  # tokens the tool wrote
    assert tool.any()
    resp_routes = routes[:, P:, 0, 0]
    assert (resp_routes[tool] >= 0).all()  # every tool token ran through the model: its experts are there
    last = torch.zeros_like(context)
    last[torch.arange(len(out)), context.sum(1) - 1] = True
    # every model token but maybe each trajectory's last (a wasted decode step runs an EOS), the EOS
    # that ends a turn included (it runs before the tool's tokens)
    assert ((resp_routes >= 0) | last)[context].all() and not (resp_routes >= 0)[~context].any()
    trainer = TrainEngine(torch.device("cpu"), "actor", forward.log_probs)
    trainer.place(model, remove_padding=True, share_prompts=True, train=False)
    _, own = forward.log_probs_and_routes(trainer, trainer.model, out, Split(4), 1.0)
    recorded = routes >= 0
    assert torch.equal(own[recorded], routes[recorded])
