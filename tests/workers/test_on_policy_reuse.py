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
        (cfg(mini=4), False),  # two mini-batches: the second is off-policy
        (cfg(epochs=2), False),
        (cfg(kl_in_reward=True), False),  # the reward's KL reads pi_old before the update
        (cfg(rollout_correction={"rollout_is": "token"}), False),
    ],
)
def test_reuse_applies_only_on_policy(c, reused):
    assert reuses_on_policy_log_prob(c, staleness_correction(c)) is reused
