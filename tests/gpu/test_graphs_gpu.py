"""CUDA-graphed packed passes (`hybridrl.models.graphs`, actor.use_cuda_graph) against the same
model's eager passes: log-probs and accumulated gradients over micro-batches of several shapes
(replays of a captured shape included), a zero_grad between steps, no-grad passes, and the
eager fallback while a graphed forward waits for its backward. Skipped without CUDA."""

import copy

import pytest
import torch
from graph_helpers import grouped_rows, tiny_qwen2

from hybridrl.models import graphs
from hybridrl.models.packing import enable_packing, pack, packed_log_probs
from hybridrl.models.prepare import compile_decoder_layers, drop_compiled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _models(compile_layers: bool):
    eager = tiny_qwen2(vocab=512, hidden=256, intermediate=512, layers=3, heads=4, kv_heads=2).cuda()
    assert enable_packing(eager, "varlen", torch.device("cuda")) == "varlen"
    graphed = copy.deepcopy(eager)
    drop_compiled(graphed)
    if compile_layers:
        compile_decoder_layers(eager)
        compile_decoder_layers(graphed)
    runner = graphs.enable(graphed, graphed.get_decoder(), torch.device("cuda"), "varlen")
    assert runner is not None
    return eager, graphed, runner


def _micro(seed: int, groups: int, n: int, R: int, share: bool):
    rows = grouped_rows(seed, groups, n, P=48, R=R, vocab=512, min_prompt=8)
    return pack(*rows, share_prompts=share).to("cuda")


def _loss(model, packed, w):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logp = packed_log_probs(model, packed)[0]
    return (logp * w[: logp.shape[0], : logp.shape[1]]).sum(), logp.detach()


def _close_grads(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.grad is not None and q.grad is not None, name
        err = float((p.grad - q.grad).norm())
        assert err <= 0.03 * float(p.grad.norm()) + 1e-6, (name, err, float(p.grad.norm()))


@pytest.fixture
def capture_at_once(monkeypatch):
    monkeypatch.setattr(graphs, "SEEN_BEFORE_CAPTURE", 1)


@pytest.mark.parametrize("compile_layers", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_graphed_passes_match_eager(compile_layers, share, capture_at_once):
    eager, graphed, runner = _models(compile_layers)
    w = torch.randn(64, 300, device="cuda")
    micros = [
        _micro(0, 4, 8, 300, share),
        _micro(1, 2, 8, 120, share),  # another bucket
        _micro(2, 4, 8, 300, share),  # a replay of the first bucket's graphs, most likely
    ]
    for step in range(2):
        for packed in micros:
            loss_e, logp_e = _loss(eager, packed, w)
            loss_g, logp_g = _loss(graphed, packed, w)
            assert float((logp_e - logp_g).abs().max()) < 0.05
            assert float((logp_e - logp_g).abs().mean()) < 0.005
            loss_e.backward()
            loss_g.backward()
        _close_grads(eager, graphed)
        runner.settle()
        for m in (eager, graphed):  # what the optimizer step's zero_grad does
            for p in m.parameters():
                p.grad = None
    shapes = {graphs.plan(p, True, True, torch.bfloat16) for p in micros}
    assert runner.captures == len(shapes) and runner.replays == 6 and runner.eager == 0

    with torch.no_grad():  # the old log-prob and reference passes
        eager.eval(), graphed.eval()
        for packed in micros:
            _, logp_e = _loss(eager, packed, w)
            _, logp_g = _loss(graphed, packed, w)
            assert float((logp_e - logp_g).abs().max()) < 0.05
    assert runner.replays == 9


def test_a_shape_is_captured_when_it_comes_again():
    eager, graphed, runner = _models(False)
    w = torch.randn(64, 300, device="cuda")
    a = _micro(0, 4, 8, 300, False)
    for i in range(3):
        with torch.no_grad():
            _, logp_g = _loss(graphed, a, w)
            _, logp_e = _loss(eager, a, w)
        assert float((logp_e - logp_g).abs().max()) < 0.05
        assert (runner.eager, runner.captures, runner.replays) == [(1, 0, 0), (1, 1, 1), (1, 1, 2)][i]


def test_a_forward_waiting_for_its_backward_sends_other_passes_to_eager(capture_at_once):
    eager, graphed, runner = _models(False)
    w = torch.randn(64, 300, device="cuda")
    a, b = _micro(0, 4, 8, 300, False), _micro(1, 4, 8, 300, False)
    loss_ga, _ = _loss(graphed, a, w)  # graphed, its backward pending
    loss_gb, logp_gb = _loss(graphed, b, w)  # must not reuse a's activations: eager
    assert runner.eager == 1 and runner.replays == 1
    _, logp_eb = _loss(eager, b, w)
    assert float((logp_eb - logp_gb).abs().max()) == 0.0  # the eager path itself
    (loss_ga + loss_gb).backward()
    loss_ea, _ = _loss(eager, a, w)
    loss_eb, _ = _loss(eager, b, w)
    (loss_ea + loss_eb).backward()
    _close_grads(eager, graphed)

    # a forward whose backward never runs: after settle() (the engine's optimizer step) the
    # graphs run again, and that stale backward would fail loudly
    stale, _ = _loss(graphed, a, w)
    runner.settle()
    fresh, _ = _loss(graphed, b, w)
    assert runner.replays == 3
    with pytest.raises(RuntimeError, match="reused before its backward"):
        stale.backward()


def test_a_capture_runs_the_code_compiled_for_the_eager_passes():
    """The capture's leaves and autocast meet the compiled layers' guards: capturing a shape,
    with and without gradients, compiles nothing new (each recompilation costs seconds)."""
    from torch._dynamo.utils import counters

    eager, graphed, runner = _models(True)
    w = torch.randn(64, 300, device="cuda")
    micros = [_micro(s, 4, 8, R, False) for s, R in ((0, 300), (1, 200), (2, 120))]
    for packed in micros:  # each bucket's first pass runs eagerly: compiled, and dynamic after the first
        loss, _ = _loss(graphed, packed, w)
        loss.backward()
        with torch.no_grad():
            _loss(graphed, packed, w)
        runner.settle()
    assert runner.captures == 0
    compiled = counters["stats"]["unique_graphs"]
    loss_g, logp_g = _loss(graphed, micros[0], w)  # the second pass of a bucket: captured
    loss_g.backward()
    with torch.no_grad():
        _, logp_g0 = _loss(graphed, micros[0], w)
    assert runner.captures == 2 and runner.replays == 2
    assert counters["stats"]["unique_graphs"] == compiled
    loss_e, logp_e = _loss(eager, micros[0], w)
    assert float((logp_e - logp_g).abs().max()) < 0.05 and float((logp_e - logp_g0).abs().max()) < 0.05
