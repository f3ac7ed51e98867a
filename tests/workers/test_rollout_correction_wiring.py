"""The train/rollout mismatch weights (ROLLOUT_IS_WEIGHTS, algorithm.rollout_correction; turned on by
the off-policy modes) reach the actor's loss through the worker's own update path: a batch that
carries them updates with a different loss and gradient, in exactly the proportion they say."""

from __future__ import annotations

import torch
from test_actor_update import make_worker, random_batch

from hybridrl.data import keys as K


def _update(model_dir, batch):
    """(pg_loss, the gradient the optimizer stepped with) of one `update_actor` on a fresh worker."""
    worker = make_worker(model_dir, use_kl_loss=False, entropy_coeff=0.0, grad_clip=1e9)
    seen = {}
    step = worker.engine.optimizer.step

    def recording_step(*args, **kwargs):
        seen.update({n: p.grad.detach().clone() for n, p in worker.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    worker.engine.optimizer.step = recording_step
    metrics = worker.update_actor(batch)
    assert seen, "the update took no optimizer step"
    return metrics["actor/pg_loss"], seen


def test_rollout_is_weights_change_the_actors_loss_and_gradient(tiny_model_dir):
    batch = random_batch()
    mask = batch[K.RESPONSE_MASK]
    loss, grads = _update(tiny_model_dir, batch.select(list(batch.tensors)))

    doubled = batch.select(list(batch.tensors))
    doubled[K.ROLLOUT_IS_WEIGHTS] = torch.full_like(mask, 2.0)
    loss2, grads2 = _update(tiny_model_dir, doubled)
    assert abs(loss2 - 2 * loss) <= 1e-5 * max(1.0, abs(loss)), (loss, loss2)
    for name, g in grads.items():  # the policy-gradient term is linear in the weights
        torch.testing.assert_close(grads2[name], 2 * g, rtol=1e-4, atol=1e-7, msg=name)

    uneven = batch.select(list(batch.tensors))
    uneven[K.ROLLOUT_IS_WEIGHTS] = torch.where(torch.arange(mask.shape[1]) % 2 == 0, 1.0, 0.0).expand_as(mask).clone()
    _, grads3 = _update(tiny_model_dir, uneven)
    differs = [n for n, g in grads.items() if not torch.allclose(grads3[n], g, rtol=1e-3, atol=1e-6)]
    assert differs, "weights zeroing half the tokens left the gradient unchanged"
