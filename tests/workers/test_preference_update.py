"""DPO / KTO / SFT updates: the accumulated gradient of one step does not depend on the micro-batch size."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data import keys as K
from hybridrl.data.preference import Record, collate_records
from hybridrl.workers.actor import ActorRolloutRefWorker


def make_worker(model_dir, algo, micro):
    cfg = config_from_dict(
        {
            "data": {"train_files": "unused.jsonl", "train_batch_size": 8},
            "actor_rollout_ref": {
                "model": {"path": model_dir, "random_init": True},
                "actor": {"ppo_micro_batch_size_per_gpu": micro},
            },
            "algorithm": {"name": algo},
            "trainer": {"device": "cpu"},
        }
    )
    torch.manual_seed(0)
    w = ActorRolloutRefWorker(cfg, plan_batches(cfg), torch.device("cpu"))
    w.init_model(model_dir, True, 10, need_ref=algo != "sft")
    w.freeze_reference()
    return w


def batch(algo, n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = lambda lo, hi: torch.randint(2, 40, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()  # noqa: E731
    keys = {"dpo": (K.CHOSEN, K.REJECTED), "kto": (K.RESPONSES,), "sft": (K.RESPONSES,)}[algo]
    recs = [Record(ids(1, 5), {k: ids(1, 6) for k in keys}, label=(i % 3 == 0) if algo == "kto" else None) for i in range(n)]
    return collate_records(recs, 0)


@pytest.mark.parametrize("algo", ["dpo", "kto", "sft"])
def test_gradient_is_independent_of_micro_batch_size(tiny_model_dir, algo):
    grads = []
    for micro in (2, 8):
        w = make_worker(tiny_model_dir, algo, micro)
        b = batch(algo)
        if algo == "dpo":
            b = w.sequence_log_probs(b, {K.CHOSEN: K.REF_CHOSEN_LOGPS, K.REJECTED: K.REF_REJECTED_LOGPS})
            b[K.REF_CHOSEN_LOGPS] = b[K.REF_CHOSEN_LOGPS] - 0.5  # away from the policy, so the loss is not flat
        elif algo == "kto":
            b = w.sequence_log_probs(b, {K.RESPONSES: K.REF_LOGPS})
            b[K.REF_LOGPS] = b[K.REF_LOGPS] + torch.linspace(-1, 1, len(b))
        w.engine.step = lambda optimizer=None: (0.0, True)  # keep the accumulated gradient instead of stepping
        m = w.update_sft(b) if algo == "sft" else w.update_preference(b, 0.3)
        grads.append(torch.cat([p.grad.flatten() for p in w.model.parameters()]))
        assert m["loss"] > 0
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    assert grads[0].abs().sum() > 0
