"""Ulysses sequence parallelism (gloo, CPU, float64): sp ranks that each run 1/sp of a packed row
give the log-probs, entropy, loss and parameter gradients of one process running the whole row."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
import ulysses_workers as W  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world,kv_heads", [(2, 2), (4, 2), (2, 1)])
def test_sequence_parallel_equals_one_process(tmp_path, world, kv_heads):
    out = str(tmp_path / "sp.pt")
    mp.start_processes(W.rank_main, args=(world, _port(), kv_heads, out), nprocs=world, start_method="spawn")
    got = torch.load(out, weights_only=True)
    logp, ent, loss, grads = W.loss_and_grads(W.model(kv_heads))
    assert torch.allclose(got["logp"], logp, rtol=0, atol=1e-12)
    assert torch.allclose(got["ent"], ent, rtol=0, atol=1e-12)
    assert torch.allclose(got["loss"], loss, rtol=0, atol=1e-11)
    assert grads.keys() == got["grads"].keys()
    for name, g in grads.items():
        assert g.abs().max() > 0, name
        assert torch.allclose(got["grads"][name], g, rtol=1e-10, atol=1e-12), name


def test_all_to_all_round_trip_and_row_split():
    from hybridrl.models.sequence_parallel import split_row

    assert split_row(10, 4, 0) == (12, 0) and split_row(10, 4, 3) == (12, 9) and split_row(8, 2, 1) == (8, 4)
