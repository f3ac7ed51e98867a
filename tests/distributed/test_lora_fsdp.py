"""LoRA under FSDP2 on 2 CPU processes (gloo): the adapters' gradients of a loss over the rows
split between the ranks, the merged weights the rollout engines get, greedy generation on the
gathered module and the checkpoint equal one process holding the whole batch."""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
import lora_workers as W  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lora_on_two_ranks_equals_one(tmp_path):
    out, ckpt = str(tmp_path / "r.pt"), tmp_path / "actor"
    mp.start_processes(W.rank_main, args=(2, _port(), out, str(ckpt)), nprocs=2, start_method="spawn")
    got = torch.load(out, weights_only=True)
    grads, merged = W.reference()
    assert grads and grads.keys() == got["grads"].keys()
    assert all(".lora_" in n for n in grads)  # only the adapters train
    for name, g in grads.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert merged.keys() == got["merged"].keys()
    for name, w in merged.items():
        torch.testing.assert_close(got["merged"][name], w, rtol=0, atol=0, msg=name)
    model = W.policy()
    assert torch.equal(got["generated"], model.generate(input_ids=W.batch()[0][:2], max_new_tokens=3, do_sample=False))
    # the checkpoint rank 0 wrote: merged weights loadable as a plain HF model, and the adapter
    from safetensors.torch import load_file

    files = load_file(ckpt / "model.safetensors")
    for name, w in merged.items():
        if name in files:
            assert torch.equal(files[name], w), name
    adapter = load_file(ckpt / "adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
