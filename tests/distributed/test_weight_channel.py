"""The weight channel between the trainer's rank 0 and the rollout pool's ranks (gloo, 3 processes)."""

from __future__ import annotations

import io
import socket

import pytest
import torch
import torch.multiprocessing as mp

from hybridrl.distributed.weight_channel import WeightChannel, WeightReceiver, WeightSender, drain


def _tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (50, 8), "layers.0.w": (8, 8), "layers.0.b": (8,), "big": (700,), "norm": (8,)}
    return [(name, torch.randn(shape, generator=g, dtype=torch.float64)) for name, shape in shapes.items()]


def _member(member: int, members: int, port_queue, results) -> None:
    device = torch.device("cpu")
    if member == 0:
        store, port = WeightChannel.host("127.0.0.1")
        for _ in range(members - 1):
            port_queue.put(port)
        channel = WeightChannel("127.0.0.1", port, 0, members, device)
        # 0.001 MB of float32 = 262 elements a bucket: the 700-element tensor alone, the rest in 3 more
        sender = WeightSender(channel, store, torch.float32, bucket_mb=0.001)
        sizes = [sender.send(_tensors(1)), sender.send(None), sender.send(_tensors(2))]
        sender.wait()
        results.put(("sender", sizes))
        return
    port = port_queue.get()
    receiver = WeightReceiver(WeightChannel("127.0.0.1", port, member, members, device))
    got = []
    for _ in range(3):
        pieces = receiver.receive()
        got.append((receiver.version, None if pieces is None else [(n, t.clone()) for n, t in pieces]))
        drain(pieces)
    results.put((member, _bytes(got)))


def _bytes(obj) -> bytes:
    """Tensors cross the queue serialized: a queued tensor is shared through a file descriptor that
    vanishes when its process exits, which can happen before the parent reads it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_sends_reach_every_receiver_exactly_in_buckets():
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_member, args=(m, 3, port_queue, results)) for m in range(3)]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=120) for _ in range(3))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    numel = sum(t.numel() for _, t in _tensors(1))
    pushed = {"rollout_pool/bytes_sent": numel * 4.0, "rollout_pool/device_staging": 1.0}  # float32 on the wire
    assert out["sender"] == [pushed, {}, pushed]  # nothing when unchanged; on the CPU auto stages "on the device"
    for member in (1, 2):
        (v1, first), (v2, unchanged), (v3, second) = torch.load(io.BytesIO(out[member]), weights_only=True)
        assert (v1, v2, v3) == (1, 1, 2) and unchanged is None
        for got, seed in ((first, 1), (second, 2)):
            want = _tensors(seed)
            assert [n for n, _ in got] == [n for n, _ in want]
            for (_, g), (_, w) in zip(got, want):
                assert g.dtype == torch.float32 and g.shape == w.shape
                assert torch.equal(g, w.to(torch.float32))


def _gone_receiver(port_queue) -> None:
    WeightChannel("127.0.0.1", port_queue.get(), 1, 2, torch.device("cpu"))  # joins, then its process ends


def test_a_receiver_that_died_fails_the_next_send():
    ctx = mp.get_context("spawn")
    port_queue = ctx.Queue()
    store, port = WeightChannel.host("127.0.0.1")
    port_queue.put(port)
    proc = ctx.Process(target=_gone_receiver, args=(port_queue,))
    proc.start()
    sender = WeightSender(WeightChannel("127.0.0.1", port, 0, 2, torch.device("cpu"), timeout_s=60), store, torch.float32, 1.0)
    proc.join(timeout=60)
    sender.send(_tensors(1))  # staged; the broadcast fails in the background
    with pytest.raises(RuntimeError, match="sending the weights to the rollout pool failed"):
        sender.send(None)


def test_stores_pick_free_ports():
    """The store picks its own port (member 0 reports it): two channels on one host do not collide."""
    a, pa = WeightChannel.host("127.0.0.1")
    b, pb = WeightChannel.host("127.0.0.1")
    assert pa != pb and pa > 0 and pb > 0
    with socket.socket() as s:  # the port is taken while the store lives
        try:
            s.bind(("127.0.0.1", pa))
            bound = True
        except OSError:
            bound = False
    assert not bound
    del a, b
