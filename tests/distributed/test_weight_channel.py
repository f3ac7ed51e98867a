"""The weight channel between the trainer's rank 0 and the rollout pool's ranks (gloo, 3 processes)."""

from __future__ import annotations

import io
import socket
import time

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


# -- each staging (distributed/weight_staging.py), end to end ----------------------------------
def _mixed(seed: int, big: int = 700) -> list[tuple[str, torch.Tensor]]:
    """Fresh random tensors of several dtypes and shapes; `big` elements is more than a bucket."""
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed", torch.randn(50, 8, generator=g)),
        ("layers.0.w", torch.randn(8, 8, generator=g).to(torch.bfloat16).t()),  # not contiguous
        ("layers.0.b", torch.randn(8, generator=g, dtype=torch.float64)),
        ("big", torch.randn(big, generator=g).to(torch.float16)),
        ("scale", torch.randn((), generator=g)),
    ]


PUSHES = [_mixed(1), None, _mixed(2), _mixed(3, big=900)]  # a push, no change, new values, a larger tensor


def _tight(device) -> int:
    return 1  # no room for a push: auto stages on the host


def _staging_sender(staging: str, port_queue, results) -> None:
    store, port = WeightChannel.host("127.0.0.1")
    port_queue.put(port)
    mode, free = ("auto", _tight) if staging == "auto-tight" else (staging, None)
    kw = {} if free is None else {"free": free}
    channel = WeightChannel("127.0.0.1", port, 0, 2, torch.device("cpu"), timeout_s=120)
    # 0.001 MB of bf16 = 524 elements a bucket
    sender = WeightSender(channel, store, torch.bfloat16, bucket_mb=0.001, staging=mode, **kw)
    metrics = []
    for i, push in enumerate(PUSHES):
        metrics.append(sender.send(push))
        store.set(f"returned/{i}", "1")  # the receiver joins only now: send returned without it
    sender.wait()
    results.put(("sender", metrics, sender.stager.stagings["host"].allocations))
    while store.add("done", 0) < 1:
        time.sleep(0.05)


def _staging_receiver(port_queue, results) -> None:
    receiver = WeightReceiver(WeightChannel("127.0.0.1", port_queue.get(), 1, 2, torch.device("cpu"), timeout_s=120))
    got = []
    for i in range(len(PUSHES)):
        receiver.channel.store.get(f"returned/{i}")  # waits for the sender's send to have returned
        pieces = receiver.receive()
        got.append(None if pieces is None else [(n, t.clone()) for n, t in pieces])
    receiver.channel.store.add("done", 1)
    results.put(("receiver", _bytes(got)))


@pytest.mark.parametrize("staging", ["device", "host", "auto-tight"])
def test_each_staging_delivers_the_exact_bits_and_returns_before_the_receiver_joins(staging):
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_staging_sender, args=(staging, port_queue, results))]
    procs.append(ctx.Process(target=_staging_receiver, args=(port_queue, results)))
    for p in procs:
        p.start()
    out = {msg[0]: msg[1:] for msg in (results.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    metrics, host_allocations = out["sender"]
    on_device = 1.0 if staging == "device" else 0.0
    assert [m.get("rollout_pool/device_staging") for m in metrics] == [on_device, None, on_device, on_device]
    # host: a buffer per bucket once (3 buckets: embed + w + b, big, scale), then only the one big outgrew
    assert host_allocations == (0 if staging == "device" else 4)
    received = torch.load(io.BytesIO(out["receiver"][0]), weights_only=True)
    for push, got in zip(PUSHES, received):
        if push is None:
            assert got is None
            continue
        assert [n for n, _ in got] == [n for n, _ in push]
        for (name, g), (_, t) in zip(got, push):
            want = t.to(torch.bfloat16)
            assert g.dtype == torch.bfloat16 and g.shape == want.shape, name
            assert torch.equal(g.view(torch.int16), want.view(torch.int16)), name  # bit for bit
    sizes = [m["rollout_pool/bytes_sent"] for m in metrics if m]
    assert sizes == [2.0 * sum(t.numel() for _, t in push) for push in PUSHES if push is not None]
