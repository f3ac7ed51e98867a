"""Packed (padding-free) passes equal the padded ones: log-probs, entropy, values and their
gradients, in float64 on tiny Qwen2 and Llama models."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hybridrl.models.logprobs import response_logits
from hybridrl.models.packing import enable_packing, pack, packed_log_probs
from hybridrl.models.value_model import ValueModel

SMALL = dict(
    vocab_size=50,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
)


def tiny(arch: str, backbone: bool = False):
    torch.manual_seed(0)
    cls, cfg_cls = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}[arch]
    cfg = cfg_cls(**SMALL, tie_word_embeddings=arch == "qwen2")
    cfg._attn_implementation = "sdpa"
    model = cls(cfg).double()
    return model.get_decoder() if backbone else model


def ragged_batch(b=5, P=6, R=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts, responses = torch.randint(2, 50, (b, P), generator=g), torch.randint(2, 50, (b, R), generator=g)
    prompt_lens = torch.tensor([6, 1, 3, 4, 2][:b])
    response_lens = torch.tensor([7, 1, 3, 5, 6][:b])
    prompt_mask = (torch.arange(P)[None] >= P - prompt_lens[:, None]).long()  # left-padded
    response_mask = (torch.arange(R)[None] < response_lens[:, None]).double()  # right-padded
    return prompts, prompt_mask, responses, response_mask


def padded_reference(model, seqs, temperature):
    logits = response_logits(model, *seqs, temperature=temperature).double()  # (b, R, V)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, seqs[2][..., None])[..., 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp * seqs[3], ent * seqs[3]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_packed_log_probs_entropy_and_gradients_equal_padded(arch):
    model = tiny(arch)
    seqs = ragged_batch()
    params = [p for p in model.parameters()]
    logp0, ent0 = padded_reference(model, seqs, 0.7)
    w = torch.randn_like(logp0)
    g0 = torch.autograd.grad((w * logp0).sum() + ent0.sum(), params)

    assert enable_packing(model, "sdpa", torch.device("cpu")) == "sdpa"
    packed = pack(*seqs)
    assert packed.num_tokens == int(seqs[1].sum() + seqs[3].sum())  # no padding computed
    logp, ent, _ = packed_log_probs(model, packed, temperature=0.7, with_entropy=True)
    torch.testing.assert_close(logp, logp0)
    torch.testing.assert_close(ent * seqs[3], ent0)
    g1 = torch.autograd.grad((w * logp).sum() + (ent * seqs[3]).sum(), params)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b)


def test_packed_with_gradient_checkpointing_matches():
    model = tiny("qwen2")
    seqs = ragged_batch()
    enable_packing(model, "sdpa", torch.device("cpu"))
    model.train()
    params = list(model.parameters())
    g0 = torch.autograd.grad(packed_log_probs(model, pack(*seqs))[0].sum(), params)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    g1 = torch.autograd.grad(packed_log_probs(model, pack(*seqs))[0].sum(), params)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b)


def test_packed_values_and_gradients_equal_padded():
    critic = ValueModel(tiny("qwen2", backbone=True)).double()
    seqs = ragged_batch()
    params = list(critic.parameters())
    v0 = critic.response_values(*seqs) * seqs[3]
    g0 = torch.autograd.grad((v0**2).sum(), params)
    enable_packing(critic.backbone, "sdpa", torch.device("cpu"))
    v1 = critic.packed_response_values(pack(*seqs))
    torch.testing.assert_close(v1, v0)
    g1 = torch.autograd.grad((v1**2).sum(), params)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b)


def test_generation_unchanged_by_the_hook():
    """Unpacked calls (generate with padding) still run plain SDPA with its masks."""
    model = tiny("qwen2").eval()
    prompts, prompt_mask, _, _ = ragged_batch()
    kw = dict(attention_mask=prompt_mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    before = model.generate(input_ids=prompts, **kw)
    enable_packing(model, "sdpa", torch.device("cpu"))
    assert torch.equal(model.generate(input_ids=prompts, **kw), before)


def test_eager_models_stay_padded():
    model = tiny("qwen2")
    model.config._attn_implementation = "eager"
    assert enable_packing(model, "auto", torch.device("cpu")) is None


def test_saved_config_does_not_mention_the_hook(tmp_path):
    model = tiny("qwen2")
    enable_packing(model, "sdpa", torch.device("cpu"))
    model.config.save_pretrained(tmp_path)
    assert "hybridrl" not in (tmp_path / "config.json").read_text()


# -- shared prompts ------------------------------------------------------------------------------
def grouped_batch(seed: int, groups=(4, 1, 3, 2), P=7, R=9):
    """Rows in groups that repeat one prompt (GRPO's n samples), fresh random prompts, ragged
    prompt and response lengths; one group appears twice, not adjacent (the same prompt drawn
    again). Responses are right-padded, prompts left-padded."""
    g = torch.Generator().manual_seed(seed)
    prompts, prompt_mask = [], []
    for size in groups:
        length = int(torch.randint(1, P + 1, (1,), generator=g))
        row = torch.zeros(P, dtype=torch.long)
        row[P - length :] = torch.randint(2, 50, (length,), generator=g)
        mask = (torch.arange(P) >= P - length).long()
        prompts += [row] * size
        prompt_mask += [mask] * size
    prompts.append(prompts[0])  # the first prompt again, last
    prompt_mask.append(prompt_mask[0])
    b = len(prompts)
    responses = torch.randint(2, 50, (b, R), generator=g)
    response_lens = torch.randint(1, R + 1, (b,), generator=g)
    response_mask = (torch.arange(R)[None] < response_lens[:, None]).double()
    return torch.stack(prompts), torch.stack(prompt_mask), responses, response_mask


def assert_same_gradients(shared, unshared):
    """Per parameter, relative to its norm. Hugging Face's RMSNorm and rotary tables compute in
    float32 even in a float64 model, so gradients summed in another order differ at ~1e-7
    (measured: <= 6e-8); dropping one sequence's share of a shared prompt moves them by ~0.3."""
    for a, b in zip(shared, unshared):
        assert float((a - b).norm()) <= 1e-6 * float(b.norm()) + 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_prompts_give_the_unshared_log_probs_entropy_and_gradients(seed):
    model = tiny("qwen2" if seed % 2 else "llama")
    enable_packing(model, "sdpa", torch.device("cpu"))
    seqs = grouped_batch(seed)
    params = list(model.parameters())
    unshared, shared = pack(*seqs), pack(*seqs, share_prompts=True)
    prompt_tokens = seqs[1].sum(1)
    # Groups of 4, 1, 3 and 2 rows, the first prompt drawn a second time: 5 distinct prompts of 11 rows.
    saved = int(prompt_tokens.sum()) - int(prompt_tokens[[0, 4, 5, 8, 10]].sum()) + int(prompt_tokens[10])
    assert shared.num_tokens == unshared.num_tokens - saved and shared.attn_tokens == unshared.num_tokens
    w = torch.randn(seqs[2].shape, dtype=torch.float64)
    outs = []
    for packed in (unshared, shared):
        logp, ent, hit = packed_log_probs(model, packed, temperature=0.8, with_entropy=True)
        loss = (w * logp).sum() + (ent * seqs[3]).sum()
        outs.append((logp, ent * seqs[3], hit, torch.autograd.grad(loss, params)))
    (l0, e0, h0, g0), (l1, e1, h1, g1) = outs
    torch.testing.assert_close(l1, l0, rtol=0, atol=1e-12)
    torch.testing.assert_close(e1, e0, rtol=0, atol=1e-12)
    assert torch.equal(h1, h0)
    assert_same_gradients(g1, g0)


def test_shared_prompts_give_the_unshared_values_and_gradients():
    critic = ValueModel(tiny("qwen2", backbone=True)).double()
    enable_packing(critic.backbone, "sdpa", torch.device("cpu"))
    seqs = grouped_batch(5)
    params = list(critic.parameters())
    v0 = critic.packed_response_values(pack(*seqs))
    g0 = torch.autograd.grad((v0**2).sum(), params)
    v1 = critic.packed_response_values(pack(*seqs, share_prompts=True))
    torch.testing.assert_close(v1, v0, rtol=0, atol=1e-12)
    assert_same_gradients(torch.autograd.grad((v1**2).sum(), params), g0)


def test_shared_packing_layout():
    """Each prompt enters the row once, at its first row; positions continue after the prompt
    in every response; the unshared row rebuilt from the packed tokens is `pack`'s."""
    seqs = grouped_batch(3, groups=(3, 2), P=5, R=4)
    unshared, shared = pack(*seqs), pack(*seqs, share_prompts=True)
    assert torch.equal(shared.input_ids[0, shared.prompt_gather], unshared.input_ids[0])
    assert torch.equal(shared.position_ids[0, shared.prompt_gather], unshared.position_ids[0])
    assert torch.equal(shared.prompt_gather[shared.prompt_take], torch.arange(shared.num_tokens))
    # the token before each response token, in both layouts
    assert torch.equal(shared.input_ids[0, shared.target_index], unshared.input_ids[0, unshared.target_index])
    assert torch.equal(shared.labels, unshared.labels) and torch.equal(shared.cu_seqlens, unshared.cu_seqlens)


def test_distinct_prompts_pack_as_before():
    seqs = ragged_batch()
    a, b = pack(*seqs), pack(*seqs, share_prompts=True)
    assert b.prompt_gather is None and torch.equal(a.input_ids, b.input_ids) and torch.equal(a.target_index, b.target_index)


def test_shared_prompts_with_gradient_checkpointing():
    model = tiny("qwen2")
    enable_packing(model, "sdpa", torch.device("cpu"))
    model.train()
    seqs, params = grouped_batch(7), list(model.parameters())
    g0 = torch.autograd.grad(packed_log_probs(model, pack(*seqs))[0].sum(), params)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    g1 = torch.autograd.grad(packed_log_probs(model, pack(*seqs, share_prompts=True))[0].sum(), params)
    assert_same_gradients(g1, g0)


def test_backend_choice_and_the_varlen_error(monkeypatch):
    """`auto` takes SDPA rows on CPU; an explicit `varlen` where FlashAttention-2 cannot run
    (a CPU, or a GPU older than Ampere) stops with what it needs, not inside the first pass."""
    from hybridrl.models import packing

    cpu = torch.device("cpu")
    assert packing.resolve_backend("auto", cpu) == "sdpa"
    assert packing.resolve_backend("flex", cpu) == "flex"
    with pytest.raises(ValueError, match="compute capability 8.0"):
        packing.resolve_backend("varlen", cpu)
    # a Turing GPU (sm75) with a FlashAttention build: auto falls back to flex, varlen is refused
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    gpu = torch.device("cuda")
    assert not packing.varlen_available(gpu) and packing.resolve_backend("auto", gpu) == "flex"
    with pytest.raises(ValueError, match="Ampere"):
        packing.resolve_backend("varlen", gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert packing.varlen_available(gpu) and packing.resolve_backend("auto", gpu) == "varlen"
