"""The actor's loss normalization is right by construction: the accumulated gradient of one
mini-batch does not depend on how it is split into micro-batches."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.workers.actor import ActorRolloutRefWorker


def make_worker(model_dir, **actor):
    cfg = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 7, "max_response_length": 6},
            "actor_rollout_ref": {"model": {"path": model_dir, "random_init": True},
                                  "actor": {"ppo_mini_batch_size": 7, "use_kl_loss": True, "entropy_coeff": 0.01, **actor}},
            "algorithm": {"adv_estimator": "gae"},
            "trainer": {"device": "cpu"},
        }  # fmt: skip
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


def grads_for_split(worker, batch, micro: int):
    worker.model.zero_grad(set_to_none=True)
    tokens = float(batch[K.RESPONSE_MASK].sum())
    for part in batch.split(micro):
        loss, _ = worker._policy_loss(part, tokens, len(batch))
        loss.backward()
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_independent_of_micro_batch_split(tiny_model_dir, mode):
    worker = make_worker(tiny_model_dir, loss_agg_mode=mode)
    batch = random_batch()
    whole = grads_for_split(worker, batch, 7)
    assert sum(g.abs().sum() for g in whole.values()) > 0
    for micro in (3, 1):
        split = grads_for_split(worker, batch, micro)
        for name, g in whole.items():
            torch.testing.assert_close(split[name], g, rtol=1e-4, atol=1e-6, msg=f"{mode}, micro={micro}, {name}")


def test_update_reports_and_skips_non_finite(tiny_model_dir, monkeypatch):
    worker = make_worker(tiny_model_dir, ppo_micro_batch_size_per_gpu=7)
    batch = random_batch()
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    batch[K.ADVANTAGES] = batch[K.ADVANTAGES] * float("nan")
    m = worker.update_actor(batch)
    assert m["actor/nonfinite_skipped"] == 1 and m["actor/nonfinite_in_a_row"] == 1
    assert all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    batch[K.ADVANTAGES] = torch.randn_like(batch[K.ADVANTAGES])
    m = worker.update_actor(batch)
    assert m["actor/nonfinite_skipped"] == 0 and m["actor/nonfinite_in_a_row"] == 0
    assert any(not torch.equal(before[n], p) for n, p in worker.model.named_parameters())
