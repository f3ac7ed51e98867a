"""LoRA through peft: only adapters train, the reference is the base with adapters off,
rollouts follow the updated policy, merged weights equal peft's merge, resume is exact."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.models.loading import load_causal_lm, load_tokenizer
from hybridrl.models.lora import apply_lora, merged_named_parameters
from hybridrl.rollout import SamplingParams
from hybridrl.workers.actor import ActorRolloutRefWorker
from hybridrl.workers.forward import SEQ_KEYS


def random_batch(n=7, P=4, R=6, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (n,), generator=g)
    return Batch(
        {
            K.PROMPTS: torch.randint(2, vocab, (n, P), generator=g),
            K.PROMPT_MASK: torch.ones(n, P, dtype=torch.long),
            K.RESPONSES: torch.randint(2, vocab, (n, R), generator=g),
            K.RESPONSE_MASK: (torch.arange(R)[None] < lengths[:, None]).float(),
            K.OLD_LOG_PROBS: -torch.rand(n, R, generator=g) * 4,
            K.REF_LOG_PROBS: -torch.rand(n, R, generator=g) * 4,
            K.ADVANTAGES: torch.randn(n, R, generator=g),
        }
    )


def lora_worker(model_dir, path=None, **model):
    cfg = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 7, "max_response_length": 6},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True, "lora_rank": 4, "lora_alpha": 8, **model},
                "actor": {"ppo_mini_batch_size": 7, "use_kl_loss": True, "optim": {"lr": 0.05}},
            },
            "algorithm": {"adv_estimator": "gae"},
            "trainer": {"device": "cpu"},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model(path or model_dir, path is None, 10, need_ref=True, ref_path=model_dir if path else None)
    w.freeze_reference()
    return w


def test_merged_named_parameters_equal_peft_merge(tiny_model_dir):
    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(tiny_model_dir, random_init=True), 4, 8, "all-linear")
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)  # peft starts B at zero: make the delta non-trivial
    ours = dict(merged_named_parameters(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert ours.keys() <= want.keys() and "model.layers.0.self_attn.q_proj.weight" in ours
    changed = 0
    for name, w in ours.items():
        torch.testing.assert_close(w, want[name], msg=name)
        changed += not torch.equal(w, model.get_base_model().state_dict().get(name.replace("proj.", "proj.base_layer."), w))
    assert changed > 0


def test_lora_trains_adapters_only_and_reference_is_the_base(tiny_model_dir):
    w = lora_worker(tiny_model_dir)
    trainable = {id(p) for p in w.model.parameters() if p.requires_grad}
    in_optim = {id(p) for g in w.optimizer.param_groups for p in g["params"]}
    assert in_optim == trainable and all("lora_" in n for n, p in w.model.named_parameters() if p.requires_grad)
    assert w.reference.model is None  # no second copy of the model

    batch = random_batch()
    base_before = {n: p.clone() for n, p in w.model.named_parameters() if not p.requires_grad}
    ref0 = w.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS]
    torch.testing.assert_close(w.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS], ref0)  # B = 0 at start
    for _ in range(3):
        w.update_actor(batch)
    assert all(torch.equal(p, base_before[n]) for n, p in w.model.named_parameters() if not p.requires_grad)
    policy = w.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    assert (policy - ref0).abs().max() > 1e-3  # the policy moved
    torch.testing.assert_close(w.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS], ref0)  # the reference did not


def test_generations_follow_the_updated_policy(tiny_model_dir):
    """verl #7495: a rollout engine that keeps sampling from the base after LoRA updates."""
    w = lora_worker(tiny_model_dir)
    prompts = Batch(
        {
            K.PROMPTS: torch.randint(2, 40, (4, 5), generator=torch.Generator().manual_seed(3)),
            K.PROMPT_MASK: torch.ones(4, 5, dtype=torch.long),
        }
    )
    greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=6)
    before = w.generate(prompts, greedy)
    batch = before.select(SEQ_KEYS)
    # Push the policy away from what it generated: negative advantage on every sampled token.
    batch[K.OLD_LOG_PROBS] = w.compute_log_prob(batch)[K.OLD_LOG_PROBS]
    batch[K.REF_LOG_PROBS] = batch[K.OLD_LOG_PROBS]
    batch[K.ADVANTAGES] = -torch.ones_like(batch[K.OLD_LOG_PROBS])
    for _ in range(5):
        w.update_actor(batch)
    after = w.generate(prompts, greedy)
    assert not torch.equal(after[K.RESPONSES], before[K.RESPONSES])
    # ... and the engine's log-probs are those of the current policy.
    diff = (after[K.ROLLOUT_LOG_PROBS] - w.compute_log_prob(after.select(SEQ_KEYS))[K.OLD_LOG_PROBS]).abs()
    assert float(diff.max()) < 1e-4


@pytest.mark.slow
def test_checkpoint_resume_is_exact_and_actor_dir_loads_merged(tiny_model_dir, tmp_path):
    w = lora_worker(tiny_model_dir)
    batch = random_batch()
    w.update_actor(batch)
    w.save_checkpoint(str(tmp_path), save_ref=True)
    assert (tmp_path / "actor" / "adapter" / "adapter_config.json").exists() and (tmp_path / "lora_base").is_dir()

    resumed = lora_worker(tiny_model_dir, path=str(tmp_path / "actor"))
    resumed.load_checkpoint(str(tmp_path))  # the optimizer (DCP); weights came with init_model(actor/)
    want = dict(w.model.named_parameters())
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p, want[n]), n
    # One more identical step on both: exact resume includes Adam's moments.
    w.update_actor(batch)
    resumed.update_actor(batch)
    for n, p in resumed.model.named_parameters():
        assert torch.equal(p, dict(w.model.named_parameters())[n]), n
    torch.testing.assert_close(
        resumed.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS],
        w.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS],
    )

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "actor", dtype=torch.float32)
    merged_sd = merged.state_dict()
    saved_policy = lora_worker(tiny_model_dir, path=str(tmp_path / "actor"))
    for name, t in merged_named_parameters(saved_policy.model):
        torch.testing.assert_close(merged_sd[name], t, msg=name)


def test_an_engine_with_its_own_weights_follows_the_lora_policy(tiny_model_dir):
    """An engine that holds a separate plain HF model gets the merged policy after each update
    (what the native engine's load_weights receives) and generates what the policy generates."""
    from hybridrl.models.packing import base_model
    from hybridrl.rollout.hf import HFRolloutEngine

    class OwnWeightsEngine(HFRolloutEngine):
        def load_weights(self, named_tensors):
            missing, unexpected = self.model.load_state_dict(dict(named_tensors), strict=False)
            assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding

    w = lora_worker(tiny_model_dir)
    own = load_causal_lm(tiny_model_dir, random_init=True)  # other (random) weights until synced
    w.rollout = OwnWeightsEngine(own, w.tokenizer)
    policy_engine = HFRolloutEngine(w.model, w.tokenizer)  # generates with the peft policy itself
    batch = random_batch()
    for _ in range(2):
        w.update_actor(batch)
    prompts = Batch({K.PROMPTS: batch[K.PROMPTS], K.PROMPT_MASK: batch[K.PROMPT_MASK]})
    greedy = SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=5)
    got, want = w.generate(prompts, greedy), policy_engine.generate(prompts, greedy)
    assert torch.equal(got[K.RESPONSES], want[K.RESPONSES])
    torch.testing.assert_close(got[K.ROLLOUT_LOG_PROBS], want[K.ROLLOUT_LOG_PROBS], rtol=1e-4, atol=1e-5)
    assert base_model(w.model) is not own


def test_lora_adapter_path_starts_from_the_saved_adapter(tiny_model_dir, tmp_path):
    """verl's actor_rollout_ref.model.lora_adapter_path: the policy is base + the saved adapter (its
    rank and alpha, not lora_rank's), trainable; the reference stays the base."""
    torch.manual_seed(0)
    base = load_causal_lm(tiny_model_dir, random_init=True)
    base.save_pretrained(tmp_path / "base")
    load_tokenizer(tiny_model_dir).save_pretrained(tmp_path / "base")  # a model directory has its tokenizer
    peft_model = apply_lora(copy.deepcopy(base), 2, 6, ["q_proj", "v_proj"])
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, generator=torch.Generator().manual_seed(1))
    peft_model.save_pretrained(tmp_path / "adapter")
    want = dict(merged_named_parameters(peft_model))

    w = lora_worker(str(tmp_path / "base"), random_init=False, lora_rank=0, lora_adapter_path=str(tmp_path / "adapter"))
    ours = dict(merged_named_parameters(w.model))
    q = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(ours[q], want[q])
    assert not torch.allclose(ours[q], base.state_dict()[q])  # the adapter's delta is in
    assert w.model.peft_config["default"].r == 2 and w.model.peft_config["default"].lora_alpha == 6
    trainable = [n for n, p in w.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_lora_adapter_path_without_an_adapter_is_a_clear_error(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="lora_adapter_path=.* holds no adapter_config.json"):
        lora_worker(tiny_model_dir, lora_adapter_path=str(tmp_path))


def _layer_inputs(model):
    seen = []
    layers = model.get_base_model().get_decoder().layers
    handles = [
        layer.register_forward_pre_hook(lambda m, a, kw: seen.append(a[0] if a else kw["hidden_states"]), with_kwargs=True)
        for layer in layers
    ]
    return seen, handles


def test_every_layer_input_takes_grad_under_grad_only_and_grads_do_not_change(tiny_model_dir):
    """One compiled graph for every decoder layer: under grad the first layer's input requires grad
    like the others' (frozen embeddings would give it none), under no_grad no layer's does."""
    torch.manual_seed(0)
    plain = load_causal_lm(tiny_model_dir, random_init=True)
    model = apply_lora(copy.deepcopy(plain), 4, 8, "all-linear")
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p)
    ids = torch.randint(2, 40, (3, 9))
    seen, handles = _layer_inputs(model)
    loss = model(input_ids=ids, use_cache=False).logits.float().pow(2).mean()
    assert [x.requires_grad for x in seen] == [True] * len(seen)
    seen.clear()
    with torch.no_grad(), model.disable_adapter():
        model(input_ids=ids, use_cache=False)
    assert [x.requires_grad for x in seen] == [False] * len(seen)
    for h in handles:
        h.remove()
    loss.backward()
    # the same adapters without the hook (peft's own wrapping): the same gradients
    from peft import LoraConfig, get_peft_model

    reference = get_peft_model(copy.deepcopy(plain), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    reference.load_state_dict(model.state_dict())
    reference(input_ids=ids, use_cache=False).logits.float().pow(2).mean().backward()
    grads = {n: p.grad for n, p in reference.named_parameters() if p.requires_grad}
    assert grads and all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_compiled_lora_layers_build_one_graph_per_grad_mode(tiny_model_dir):
    """The reference pass (no_grad, adapters off) and two updates of different lengths: 2 graphs, as
    in full fine-tuning, where an input without grad to the first layer made 3 (dynamo, eager backend)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(tiny_model_dir, random_init=True), 4, 8, "all-linear")
    for layer in model.get_base_model().get_decoder().layers:
        layer.compile(dynamic=True, backend="eager")
    try:
        for n in (7, 11):
            ids = torch.randint(2, 40, (2, n))
            with torch.no_grad(), model.disable_adapter():
                model(input_ids=ids, use_cache=False)
            model(input_ids=ids, use_cache=False).logits.float().mean().backward()
        assert counters["stats"]["unique_graphs"] == 2
    finally:
        torch._dynamo.reset()
