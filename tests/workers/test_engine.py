"""The TrainEngine's one update loop, on a least-squares objective whose gradient is worked out
by hand: steps per epoch and mini-batch, exact accumulation over any split, the non-finite
guard, and a named second optimizer that leaves the main one's state alone."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import OptimConfig
from hybridrl.data.batch import Batch
from hybridrl.workers.engine import Split, TrainEngine
from hybridrl.workers.optim import build_scheduler


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


def test_steps_on_the_device_equal_the_host_path_with_a_skipped_step_between():
    """With the fused AdamW (CUDA's default; fused on CPU here) the guarded step skips a
    non-finite gradient on the device and the host reads the flag one step later: the weights,
    the warm-up schedule, the step counters and the metrics equal the host path's, a NaN
    mini-batch in the middle of an update included."""
    from hybridrl.workers.optim import steps_on_device

    def run(on_device: bool):
        engine = make_engine(lr_warmup_steps=5, betas=[0.9, 0.99])
        engine.optimizer = torch.optim.AdamW(engine.model.parameters(), lr=0.1, weight_decay=0.0, betas=(0.9, 0.99), fused=True)
        engine.scheduler = build_scheduler(engine.optimizer, OptimConfig(lr=0.1, lr_warmup_steps=5), 100)
        engine.grad_clip = 0.5
        engine.on_device = on_device and steps_on_device(engine.optimizer)
        assert engine.on_device == on_device
        batch = rows(n=12, seed=3)
        batch["y"][5] = float("nan")  # the second mini-batch of four rows
        out = [engine.update(batch, LeastSquares(), Split(2), mini_size=4)]
        lrs = [engine.scheduler.get_last_lr()[0]]
        out.append(engine.update(rows(n=8, seed=4), LeastSquares(), Split(4), mini_size=4))
        lrs.append(engine.scheduler.get_last_lr()[0])
        return engine, out, lrs

    host, host_metrics, host_lrs = run(False)
    dev, dev_metrics, dev_lrs = run(True)
    assert torch.equal(host.model.weight, dev.model.weight)
    assert host_lrs == dev_lrs == pytest.approx([0.1 * 3 / 5, 0.1 * 5 / 5])  # the skipped step did not advance it
    assert host_metrics[0]["toy/nonfinite_skipped"] == dev_metrics[0]["toy/nonfinite_skipped"] == [0.0, 1.0, 0.0]
    for a, b in zip(host_metrics, dev_metrics):
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(torch.tensor(a[k]), torch.tensor(b[k]), rtol=0, atol=0, equal_nan=True)
    assert host.steps_taken == dev.steps_taken == 4 and host.nonfinite_in_a_row == dev.nonfinite_in_a_row == 0
    assert host.optimizer.state_dict()["state"][0]["step"] == dev.optimizer.state_dict()["state"][0]["step"] == 4
    # a skipped last step: read by the end of the update
    batch = rows(n=4, seed=5)
    batch["y"][0] = float("inf")
    dev.update(batch, LeastSquares(), Split(4))
    assert dev._unread is None and dev.nonfinite_in_a_row == 1 and dev.steps_taken == 4
