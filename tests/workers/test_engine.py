"""The TrainEngine's one update loop, on a least-squares objective whose gradient is worked out
by hand: steps per epoch and mini-batch, exact accumulation over any split, the non-finite
guard, and a named second optimizer that leaves the main one's state alone."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import OptimConfig
from hybridrl.data.batch import Batch
from hybridrl.workers.engine import Split, TrainEngine


def linear(engine, model, micro):
    return model(micro["x"]).squeeze(-1)  # (b,)


class LeastSquares:
    """sum over the mini-batch of (w . x - y)^2, divided by its row count."""

    def norms(self, mini):
        return {"rows": float(len(mini))}

    def __call__(self, forward, micro, norms):
        loss = ((forward(micro) - micro["y"]) ** 2).sum() / norms["rows"]
        return loss, {"loss": loss.detach()}

    def summarize(self, micros, norms):
        return {"loss": [sum(float(m["loss"]) for m in micros)]}


def make_engine(**optim):
    engine = TrainEngine(torch.device("cpu"), "toy", linear)
    engine.place(torch.nn.Linear(3, 1, bias=False).double(), remove_padding=False)
    with torch.no_grad():
        engine.model.weight.zero_()
    engine.build_optimizer(OptimConfig(lr=0.1, weight_decay=0.0, **optim), total_steps=100, grad_clip=0.0)
    return engine


def rows(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, 3, generator=g, dtype=torch.float64), torch.randn(n, generator=g, dtype=torch.float64)
    return Batch({"x": x, "y": y})


@pytest.mark.parametrize("micro", [1, 3, 4])
def test_backward_accumulates_the_mini_batch_gradient(micro):
    engine, batch = make_engine(), rows()
    metrics = engine.backward(batch, LeastSquares(), Split(micro))
    x, y = batch["x"], batch["y"]
    # at w = 0: loss = mean(y^2), d/dw = -2/n * sum_i y_i x_i
    torch.testing.assert_close(engine.model.weight.grad[0], -2 / 4 * (y[:, None] * x).sum(0), rtol=1e-12, atol=0)
    assert metrics["loss"] == [pytest.approx(float((y**2).mean()), rel=1e-12)]


def test_update_steps_once_per_mini_batch_and_skips_non_finite():
    engine, batch = make_engine(), rows()
    m = engine.update(batch, LeastSquares(), Split(1), epochs=3, mini_size=2)
    assert len(m["loss"]) == len(m["toy/grad_norm"]) == 6 and m["toy/nonfinite_skipped"] == [0.0] * 6
    assert engine.scheduler.last_epoch == 6 and engine.steps_taken == 6
    weight = engine.model.weight.detach().clone()
    batch["y"][0] = float("nan")
    m = engine.update(batch, LeastSquares(), Split(2))
    assert m["toy/nonfinite_skipped"] == [1.0] and engine.nonfinite_in_a_row == 1 and engine.steps_taken == 6
    assert torch.equal(engine.model.weight, weight)
    out = engine.summarize(m)
    assert out["toy/nonfinite_skipped"] == 1 and out["toy/nonfinite_in_a_row"] == 1 and out["toy/lr"] == 0.1


def test_named_optimizer_steps_beside_the_main_one():
    engine, batch = make_engine(), rows()
    engine.add_optimizer("warmup", lambda params: torch.optim.SGD(params, lr=0.5), max_norm=1e9)
    engine.update(batch, LeastSquares(), Split(4), optimizer="warmup")
    x, y = batch["x"], batch["y"]
    torch.testing.assert_close(engine.model.weight[0], 0.5 * 2 / 4 * (y[:, None] * x).sum(0), rtol=1e-12, atol=0)
    assert engine.optimizer.state == {} and engine.scheduler.last_epoch == 0  # the main optimizer never stepped
    assert engine.steps_taken == 1
