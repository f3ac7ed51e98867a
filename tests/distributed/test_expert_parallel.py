"""Expert parallelism for training (distributed/expert_parallel.py), 2 gloo ranks on CPU: experts
split over the ranks with all-to-all token dispatch, FSDP2 over the rest, give the loss, the
gradients (experts, router and dense parts), the gradient norm and the load metrics of EP=1; the
split experts checkpoint (DCP) and export (HF, one tensor per expert) as whole ones."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
import expert_parallel_workers as W  # noqa: E402

pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ep2_gives_the_loss_and_gradients_of_ep1(tmp_path):
    out = str(tmp_path / "r.pt")
    mp.start_processes(W.rank_main, args=(2, _port(), out, str(tmp_path / "ckpt")), nprocs=2, start_method="spawn")
    r = torch.load(out, weights_only=True)  # our workers' own results: tensors, numbers, tuples
    one, two = r[1], r[2]
    assert two["expert_shape"] == (2, 64, 32)  # 2 of the 4 experts per rank, whole
    assert abs(one["loss"] - two["loss"]) < 1e-6 * max(1.0, abs(one["loss"]))
    assert one["grads"].keys() == two["grads"].keys()
    for name, g in one["grads"].items():
        torch.testing.assert_close(two["grads"][name], g, atol=1e-6, rtol=1e-5, msg=name)
    assert any("experts" in n and float(g.abs().sum()) > 0 for n, g in one["grads"].items())
    torch.testing.assert_close(torch.as_tensor(two["norm"]), torch.as_tensor(one["norm"]), atol=1e-6, rtol=1e-5)
    for k in ("moe/aux_loss", "moe/expert_load_max_over_mean"):
        assert abs(one["moe"][k] - two["moe"][k]) < 1e-5, k
    for name, w in two["weights"].items():  # whole tensors for the weight sync and exports
        assert torch.equal(w, one["weights"][name]), name
        assert torch.equal(r["reloaded"][name], w), name
    from hybridrl.models.loading import load_causal_lm

    exported = dict(load_causal_lm(str(tmp_path / "ckpt" / "hf")).named_parameters())
    for name, w in two["weights"].items():
        assert torch.equal(exported[name], w), name
