"""The actor's loss normalization is right by construction: the accumulated gradient of one
mini-batch does not depend on how it is split into micro-batches."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import partition_by_tokens, sequence_lengths
from hybridrl.workers.actor import ActorRolloutRefWorker
from hybridrl.workers.engine import Split
from hybridrl.workers.forward import SEQ_KEYS
from hybridrl.workers.objectives import PPOPolicyLoss


def make_worker(model_dir, **actor):
    cfg = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 7, "max_response_length": 6},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {"ppo_mini_batch_size": 7, "use_kl_loss": True, "entropy_coeff": 0.01, **actor},
            },
            "algorithm": {"adv_estimator": "gae"},
            "trainer": {"device": "cpu"},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model(model_dir, True, 10, need_ref=True)
    w.freeze_reference()
    return w


def random_batch(n=7, P=4, R=6, vocab=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (n,), generator=g)
    response_mask = (torch.arange(R)[None] < lengths[:, None]).float()
    return Batch(
        {
            K.PROMPTS: torch.randint(2, vocab, (n, P), generator=g),
            K.PROMPT_MASK: torch.ones(n, P, dtype=torch.long),
            K.RESPONSES: torch.randint(2, vocab, (n, R), generator=g),
            K.RESPONSE_MASK: response_mask,
            K.OLD_LOG_PROBS: -torch.rand(n, R, generator=g) * 4,
            K.REF_LOG_PROBS: -torch.rand(n, R, generator=g) * 4,
            K.ADVANTAGES: torch.randn(n, R, generator=g),
        }
    )


def grads_for_split(worker, batch, micro: int | None = None, budget: int | None = None):
    """The accumulated gradient of one optimizer step, split as the update splits it."""
    a = worker.arr.actor
    a.use_dynamic_bsz = budget is not None
    a.ppo_max_token_len_per_gpu = budget or 0
    worker.plan = dataclasses.replace(worker.plan, actor=dataclasses.replace(worker.plan.actor, micro_batch=micro or 7))
    worker.model.zero_grad(set_to_none=True)
    split = Split(worker.plan.actor.micro_batch, a.use_dynamic_bsz, a.ppo_max_token_len_per_gpu, "ppo_max_token_len_per_gpu")
    worker.engine.backward(batch, PPOPolicyLoss(a, worker.temperature), split)
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


def budget_for(batch, parts: int) -> int:
    """The smallest token budget that splits `batch` into exactly `parts` micro-batches."""
    lengths = sequence_lengths(batch).tolist()
    for budget in range(max(lengths), sum(lengths) + 1):
        if len(partition_by_tokens(lengths, budget)) == parts:
            return budget
    raise AssertionError(f"no budget gives {parts} micro-batches")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("packed", [True, False])
def test_gradient_independent_of_micro_batch_split(tiny_model_dir, mode, packed):
    """1, 3 and 7 micro-batches, fixed or by token budget, give the single-batch gradient (float64)."""
    worker = make_worker(tiny_model_dir, loss_agg_mode=mode)
    worker.model.double()
    if not packed:
        worker.engine.packing = None
    batch = random_batch()
    whole = grads_for_split(worker, batch, micro=7)
    assert sum(g.abs().sum() for g in whole.values()) > 0
    splits = {
        "fixed 3": dict(micro=3),
        "fixed 1": dict(micro=1),
        "budget 3": dict(budget=budget_for(batch, 3)),
        "budget 7": dict(budget=budget_for(batch, 7)),
    }
    for name, split in splits.items():
        got = grads_for_split(worker, batch, **split)
        for pname, g in whole.items():
            # The padded path computes log-probs in float32 (its logits are float32 at best).
            tol = {} if packed else dict(rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(got[pname], g, **tol, msg=f"{mode}, {name}, {pname}")


def test_packed_and_padded_log_probs_agree(tiny_model_dir):
    worker = make_worker(tiny_model_dir)
    batch = random_batch()
    packed = worker.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    backend, worker.engine.packing = worker.engine.packing, None
    padded = worker.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    assert backend == "sdpa"
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-5)


def test_update_reports_pad_fraction(tiny_model_dir):
    worker = make_worker(tiny_model_dir, ppo_micro_batch_size_per_gpu=7)
    batch = random_batch()
    assert worker.update_actor(batch)["actor/pad_fraction"] == 0.0  # packed: no padding computed
    worker.engine.packing = None
    real = float(batch[K.PROMPT_MASK].sum() + batch[K.RESPONSE_MASK].sum())
    want = 1 - real / (7 * (4 + 6))
    assert worker.update_actor(batch)["actor/pad_fraction"] == pytest.approx(want)


def test_update_reports_and_skips_non_finite(tiny_model_dir, monkeypatch):
    worker = make_worker(tiny_model_dir, ppo_micro_batch_size_per_gpu=7)
    batch = random_batch()
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    batch[K.ADVANTAGES] = batch[K.ADVANTAGES] * float("nan")
    m = worker.update_actor(batch)
    assert m["actor/nonfinite_skipped"] == 1 and m["actor/nonfinite_in_a_row"] == 1
    assert all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    assert not worker.sync.dirty  # nothing changed: the engine needs no weight sync
    batch[K.ADVANTAGES] = torch.randn_like(batch[K.ADVANTAGES])
    m = worker.update_actor(batch)
    assert m["actor/nonfinite_skipped"] == 0 and m["actor/nonfinite_in_a_row"] == 0
    assert any(not torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    assert worker.sync.dirty


def test_reference_copy_has_its_own_layers(tiny_model_dir):
    """freeze_reference after the layers were compiled: the copy must not call the policy's layers
    through a copied torch.compile wrapper (compilation itself is lazy: nothing compiles here)."""
    from hybridrl.models.prepare import compile_decoder_layers

    worker = make_worker(tiny_model_dir)
    worker.release_reference()
    compile_decoder_layers(worker.model)
    worker.freeze_reference()
    assert all(m._compiled_call_impl is None for m in worker.reference.model.modules())
    ref = worker.reference.model
    assert ref.config._attn_implementation == worker.model.config._attn_implementation == "hybridrl_packed_sdpa"


def test_loaded_reference_runs_packed(tiny_model_with_weights):
    """A reference loaded from disk (resume) gets the packed-attention hook too."""
    worker = make_worker(tiny_model_with_weights)
    worker.release_reference()
    worker.init_model(tiny_model_with_weights, False, 10, need_ref=True, ref_path=tiny_model_with_weights)
    assert worker.reference.model.config._attn_implementation == "hybridrl_packed_sdpa"
    batch = random_batch()
    ref = worker.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS]
    policy = worker.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    torch.testing.assert_close(ref, policy)  # same weights, same passes


def test_generation_does_not_use_the_compiled_layers(tiny_model_dir):
    from hybridrl.models.prepare import compile_decoder_layers
    from hybridrl.rollout import SamplingParams

    worker = make_worker(tiny_model_dir)
    compile_decoder_layers(worker.model)
    layers = worker.model.get_decoder().layers

    def must_not_run(*args, **kwargs):
        raise AssertionError("generation called a compiled layer")

    for layer in layers:
        layer._compiled_call_impl = must_not_run  # stands for the compiled wrapper
    prompts = Batch({K.PROMPTS: torch.randint(2, 40, (2, 3)), K.PROMPT_MASK: torch.ones(2, 3, dtype=torch.long)})
    out = worker.generate(prompts, SamplingParams(n=1, do_sample=False, temperature=0.0, max_new_tokens=3))
    assert out[K.RESPONSES].shape[0] == 2
    assert all(layer._compiled_call_impl is must_not_run for layer in layers)  # restored for the training passes


def test_reference_copy_runs_the_policys_passes(tiny_model_dir):
    """freeze_reference copies the policy: right after, the reference's log-probs are the
    policy's to the bit (same weights, same packed passes); after an update they are not."""
    worker = make_worker(tiny_model_dir, ppo_micro_batch_size_per_gpu=7)
    batch = random_batch()
    batch[K.PROMPT_MASK][:3, :2] = 0  # left padding: a padded pass would not be the packed one to the bit
    policy = worker.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS]
    assert torch.equal(worker.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS], policy)
    worker.update_actor(batch)
    assert not torch.equal(worker.compute_log_prob(batch.select(SEQ_KEYS))[K.OLD_LOG_PROBS], policy)
    assert torch.equal(worker.compute_ref_log_prob(batch.select(SEQ_KEYS))[K.REF_LOG_PROBS], policy)


@pytest.mark.parametrize("budget", [None, 40], ids=["fixed", "token-budget"])
def test_shared_prompts_give_the_unshared_update_gradient(tiny_model_dir, budget):
    """A GRPO-shaped batch (rows repeat their group's prompt, left-padded, ragged): the update's
    gradient with actor_rollout_ref.model.share_prompts (the default) equals the one computed
    without sharing (float64; HF's norms round in float32, hence 1e-6 of the norm), and the
    shared passes computed fewer token positions."""
    worker = make_worker(tiny_model_dir)
    worker.model.double()
    assert worker.engine.share_prompts
    g = torch.Generator().manual_seed(11)
    batch = random_batch(n=8, P=6, seed=4)
    prompt_lens = torch.randint(1, 7, (4,), generator=g).repeat_interleave(2)
    batch[K.PROMPT_MASK] = (torch.arange(6)[None] >= 6 - prompt_lens[:, None]).long()
    batch[K.PROMPTS] = batch[K.PROMPTS][::2].repeat_interleave(2, 0) * batch[K.PROMPT_MASK]
    worker.engine.shared = 0
    shared = grads_for_split(worker, batch, micro=4, budget=budget)
    assert worker.engine.shared == int(batch[K.PROMPT_MASK][::2].sum())  # each prompt's second copy
    worker.engine.share_prompts = False
    unshared = grads_for_split(worker, batch, micro=4, budget=budget)
    assert sum(float(v.abs().sum()) for v in unshared.values()) > 0
    for name in unshared:
        assert float((shared[name] - unshared[name]).norm()) <= 1e-6 * float(unshared[name].norm()) + 1e-12, name


def test_the_fsdp_accumulation_options_reach_every_optimizer_step(tiny_model_dir, monkeypatch):
    """actor.fsdp_config.reduce_grads_once / reshard_after_forward are handed to `fsdp.accumulation`
    around each mini-batch's micro-batches, with their count (tests/distributed/test_fsdp_accumulation.py
    shows what they do on two ranks)."""
    from hybridrl.workers import engine as engine_module

    seen = []
    real = engine_module.accumulation

    def spy(model, micro_batches, **kw):
        seen.append((micro_batches, kw))
        return real(model, micro_batches, **kw)

    monkeypatch.setattr(engine_module, "accumulation", spy)
    worker = make_worker(
        tiny_model_dir, ppo_micro_batch_size_per_gpu=1, fsdp_config={"reduce_grads_once": True, "reshard_after_forward": False}
    )
    worker.update_actor(random_batch())
    assert seen == [(7, {"reduce_grads_once": True, "reshard_after_forward": False})]  # 7 rows, one a micro-batch
    seen.clear()
    make_worker(tiny_model_dir, ppo_micro_batch_size_per_gpu=7).update_actor(random_batch())
    assert seen == [(1, {"reduce_grads_once": False, "reshard_after_forward": True})]
