"""actor.reuse_on_policy_log_prob: on an on-policy step the update's own log-probs are pi_old, so
the loss and gradient equal those with a recomputed old log-prob pass (float64). And multi-turn
batches: tool tokens are context (RESPONSE_ATTENTION_MASK) but not trained (RESPONSE_MASK)."""

from __future__ import annotations

import pytest
import torch
from test_actor_update import grads_for_split, make_worker, random_batch

from hybridrl.config import config_from_dict
from hybridrl.data import keys as K
from hybridrl.trainer.async_rollout import staleness_correction
from hybridrl.trainer.ppo import reuses_on_policy_log_prob
from hybridrl.workers import forward


def with_tool_tokens(batch, seed=1):
    """Turn part of each response into 'tool' tokens: in the context, out of the loss."""
    g = torch.Generator().manual_seed(seed)
    attention = batch[K.RESPONSE_MASK].clone()
    mask = attention.clone()
    for i in range(len(batch)):
        n = int(attention[i].sum())
        if n >= 4:
            start = int(torch.randint(1, n - 2, (1,), generator=g))
            mask[i, start : start + 2] = 0  # two tool tokens between model tokens
    batch[K.RESPONSE_ATTENTION_MASK] = attention
    batch[K.RESPONSE_MASK] = mask
    return batch


@pytest.mark.parametrize("multi_turn", [False, True], ids=["single-turn", "multi-turn"])
def test_reused_log_probs_give_the_recomputed_gradient(tiny_model_dir, multi_turn):
    worker = make_worker(tiny_model_dir)
    worker.model.double()
    batch = random_batch(seed=3)
    if multi_turn:
        batch = with_tool_tokens(batch)
    batch = batch.select([k for k in batch.tensors if k != K.OLD_LOG_PROBS])
    batch[K.ROLLOUT_LOG_PROBS] = -torch.rand(batch[K.RESPONSES].shape, dtype=torch.float64)
    # the old log-prob pass, in float64 (the worker's compute_log_prob stores float32)
    recomputed = batch.select(list(batch.tensors))
    with torch.no_grad():
        old, _, _ = forward.log_probs(worker.engine, worker.model, recomputed, temperature=worker.temperature)
    recomputed[K.OLD_LOG_PROBS] = old * recomputed[K.RESPONSE_MASK]
    want = grads_for_split(worker, recomputed, micro=3)
    got = grads_for_split(worker, batch, micro=3)  # no OLD_LOG_PROBS: the update's own forward
    assert sum(g.abs().sum() for g in want.values()) > 0
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12)


def test_tool_tokens_are_context_in_packed_and_padded_passes(tiny_model_dir):
    """The log-probs of model tokens after tool tokens: packed == padded == one plain forward of
    the whole sequence (float64); outputs at tool tokens are zeroed."""
    worker = make_worker(tiny_model_dir)
    worker.model.double()
    batch = with_tool_tokens(random_batch(seed=5))

    def log_probs():  # the old/ref log-prob pass, kept in float64
        with torch.no_grad():
            lp, _, _ = forward.log_probs(worker.engine, worker.model, batch, temperature=worker.temperature)
        return lp * batch[K.RESPONSE_MASK]

    packed = log_probs()
    worker.engine.packing = None
    padded = log_probs()
    torch.testing.assert_close(padded.double(), packed, rtol=1e-6, atol=1e-6)  # the padded path's log-softmax is float32
    for i in range(len(batch)):
        n = int(batch[K.RESPONSE_ATTENTION_MASK][i].sum())
        seq = torch.cat([batch[K.PROMPTS][i], batch[K.RESPONSES][i][:n]])[None]
        with torch.no_grad():
            logits = worker.model(seq).logits[0, batch[K.PROMPTS].shape[1] - 1 : -1]
        want = torch.log_softmax(logits / worker.temperature, -1).gather(-1, batch[K.RESPONSES][i][:n, None])[:, 0]
        want = want * batch[K.RESPONSE_MASK][i][:n]
        torch.testing.assert_close(packed[i][:n], want, rtol=1e-9, atol=1e-12)
    assert (packed * (1 - batch[K.RESPONSE_MASK])).abs().sum() == 0


def cfg(**kw):
    actor = {"ppo_mini_batch_size": kw.pop("mini", 8), "reuse_on_policy_log_prob": kw.pop("reuse", True)}
    actor["ppo_epochs"] = kw.pop("epochs", 1)
    actor["shuffle"] = kw.pop("shuffle", False)
    return config_from_dict(
        {
            "data": {"train_files": "x.jsonl", "train_batch_size": 8},
            "actor_rollout_ref": {"model": {"path": "m"}, "actor": actor},
            "algorithm": {"use_kl_in_reward": kw.pop("kl_in_reward", False), **kw},
        }
    )


@pytest.mark.parametrize(
    "c, reused",
    [
        (cfg(), True),
        (cfg(reuse=False), False),
        (cfg(mini=4), True),  # two mini-batches: the update computes the second's pi_old first
        (cfg(epochs=2), False),
        (cfg(mini=4, shuffle=True), False),  # shuffled mini-batches: the first is not known beforehand
        (cfg(kl_in_reward=True), False),  # the reward's KL reads pi_old before the update
        (cfg(rollout_correction={"rollout_is": "token"}), False),
    ],
)
def test_reuse_applies_only_on_policy(c, reused):
    assert reuses_on_policy_log_prob(c, staleness_correction(c)) is reused


@pytest.mark.parametrize("budget", [None, 20], ids=["fixed", "token-budget"])
def test_several_mini_batches_take_pi_old_from_before_the_first_step(tmp_path, budget, tiny_model_dir):
    """Two mini-batches of 4 of 8 rows, without OLD_LOG_PROBS: the first is updated on-policy (no
    pi_old given: its own forward, the gradient test above), the second with pi_old computed before
    the first optimizer step, equal to the old log-prob stage's values for those rows."""
    from hybridrl.config import plan_batches
    from hybridrl.workers.actor import ActorRolloutRefWorker

    model_dir = tiny_model_dir
    c = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 8, "max_prompt_length": 4, "max_response_length": 6},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {
                    "ppo_mini_batch_size": 4,
                    "ppo_micro_batch_size_per_gpu": 2,
                    "use_dynamic_bsz": budget is not None,
                    "ppo_max_token_len_per_gpu": budget or 16384,
                    "reuse_on_policy_log_prob": True,
                    "optim": {"lr": 1e-2},
                },
                "rollout": {"log_prob_micro_batch_size_per_gpu": 3},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"device": "cpu"},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(c, plan_batches(c), torch.device("cpu"))
    w.init_model(model_dir, True, 10, need_ref=False)
    batch = random_batch(n=8, seed=7)
    batch = batch.select([k for k in batch.tensors if k not in (K.OLD_LOG_PROBS, K.REF_LOG_PROBS)])
    batch[K.ROLLOUT_LOG_PROBS] = -torch.rand(batch[K.RESPONSES].shape)
    want = w.compute_log_prob(batch.select(list(batch.tensors)))[K.OLD_LOG_PROBS]  # the stage, before the update
    parts, update = [], w.engine.update

    def recording(part, objective, split, **kw):
        parts.append((part, kw["mini_size"]))
        return update(part, objective, split, **kw)

    w.engine.update = recording
    before = [p.detach().clone() for p in w.model.parameters()]
    metrics = w.update_actor(batch)
    assert [(len(p), mini) for p, mini in parts] == [(4, 4), (4, 4)]
    (head, _), (tail, _) = parts
    assert K.OLD_LOG_PROBS not in head and K.ROLLOUT_LOG_PROBS in head  # on-policy, compared with the engine's
    assert torch.equal(head[K.RESPONSES], batch[K.RESPONSES][:4]) and torch.equal(tail[K.RESPONSES], batch[K.RESPONSES][4:])
    torch.testing.assert_close(tail[K.OLD_LOG_PROBS], want[4:], rtol=0, atol=1e-6)
    assert metrics["actor/grad_norm"] > 0 and any(not torch.equal(a, b) for a, b in zip(before, w.model.parameters()))


def test_the_policy_loss_slices_pi_old_for_the_later_mini_batches():
    """`PPOPolicyLoss.passes`: with reuse (no OLD_LOG_PROBS), one epoch, unshuffled and several
    mini-batches, the first mini-batch is on-policy and the rest carry the pass's log-probs as
    OLD_LOG_PROBS (and no engine log-probs); otherwise the batch is one part."""
    from hybridrl.config.schema import ActorConfig
    from hybridrl.data.batch import Batch
    from hybridrl.workers.objectives import PPOPolicyLoss

    rows = torch.arange(6.0)[:, None].expand(6, 3)  # (6, R): row i holds i
    batch = Batch({K.RESPONSES: rows.long(), K.ROLLOUT_LOG_PROBS: -rows, K.ADVANTAGES: rows})
    seen = []

    def pass_over(part):
        seen.append(part[K.RESPONSES][:, 0].tolist())
        return part[K.ADVANTAGES] * 10

    loss = PPOPolicyLoss(ActorConfig(ppo_epochs=1, shuffle=False), 1.0)
    head, tail = loss.passes(batch, 2, pass_over)
    assert seen == [[2, 3, 4, 5]]
    assert head[K.RESPONSES][:, 0].tolist() == [0, 1] and K.OLD_LOG_PROBS not in head
    assert torch.equal(tail[K.OLD_LOG_PROBS], rows[2:] * 10) and K.ROLLOUT_LOG_PROBS not in tail
    assert loss.passes(batch, 6, pass_over) == [batch]  # one mini-batch: all on-policy
    for actor in (ActorConfig(ppo_epochs=2, shuffle=False), ActorConfig(ppo_epochs=1, shuffle=True)):
        assert PPOPolicyLoss(actor, 1.0).passes(batch, 2, pass_over) == [batch]
    recomputed = Batch({**batch.tensors, K.OLD_LOG_PROBS: -rows})
    assert loss.passes(recomputed, 2, pass_over) == [recomputed] and len(seen) == 1


def test_on_policy_update_counts_improbable_tokens_by_the_trainers_log_probs(tiny_model_dir):
    """With no old log-prob pass the update reports rollout/improbable_token_frac from its own
    forward (the trainer's probabilities), never from the engine's: here the engine gave every
    token p ~ 0.99 and a sharpened head makes most of them improbable to the trainer."""
    from hybridrl.algorithms import improbable_token_frac

    worker = make_worker(tiny_model_dir)
    with torch.no_grad():
        worker.model.get_output_embeddings().weight.mul_(25.0)  # peaked: improbable tokens for the trainer
    batch = random_batch(seed=4)
    batch = batch.select([k for k in batch.tensors if k != K.OLD_LOG_PROBS])
    batch[K.ROLLOUT_LOG_PROBS] = torch.full(batch[K.RESPONSES].shape, -0.01)
    with torch.no_grad():
        trainer, _, _ = forward.log_probs(worker.engine, worker.model, batch, temperature=worker.temperature)
    want = float(improbable_token_frac(trainer, batch[K.RESPONSE_MASK]))
    assert 0.1 < want < 0.9, want
    got = worker.update_actor(batch)["rollout/improbable_token_frac"]
    assert got == pytest.approx(want, abs=1e-6)
