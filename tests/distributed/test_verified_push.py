"""Verified weight pushes (rollout.weight_checksum_interval) over the gloo weight channel: the
receivers check what they loaded on pushes N, 2N, ... only, and a change on the receiving side
stops the run with the tensor's name."""

from __future__ import annotations

import time

import pytest
import torch
import torch.multiprocessing as mp

from hybridrl.distributed.weight_channel import WeightChannel, WeightReceiver, WeightSender, drain
from hybridrl.distributed.weight_checksum import WeightChecksumError

PUSHES = 5  # versions 1..5, with a header-only send after the first


def _tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"embed": (50, 8), "layers.0.w": (8, 8), "layers.0.b": (8,), "big": (700,)}
    return [(name, torch.randn(shape, generator=g, dtype=torch.float64)) for name, shape in shapes.items()]


def _sender(port_queue, members: int, interval: int, results, staging: str = "auto") -> None:
    store, port = WeightChannel.host("127.0.0.1")
    for _ in range(members - 1):
        port_queue.put(port)
    channel = WeightChannel("127.0.0.1", port, 0, members, torch.device("cpu"))
    sender = WeightSender(channel, store, torch.bfloat16, bucket_mb=0.001, checksum_interval=interval, staging=staging)
    sender.send(_tensors(1))
    sender.send(None)  # no change: not a push, not counted
    for seed in range(2, PUSHES + 1):
        sender.send(_tensors(seed))
    sender.wait()
    results.put(("sender", None))
    while store.add("done", 0) < members - 1:  # the store lives here: up until the receivers are through
        time.sleep(0.05)


def _receiver(member: int, members: int, port_queue, corrupt_at: int, results, lose_at: int = -1) -> None:
    receiver = WeightReceiver(WeightChannel("127.0.0.1", port_queue.get(), member, members, torch.device("cpu")))
    engine = {name: torch.zeros(t.shape, dtype=torch.bfloat16) for name, t in _tensors(0)}  # the "loaded" weights
    log = []
    for _ in range(PUSHES + 1):
        pieces = receiver.receive()
        for name, t in pieces or ():
            engine[name].copy_(t)
        drain(pieces)
        if receiver.version == corrupt_at and pieces is not None:
            engine["layers.0.w"].view(torch.int16)[3, 5] ^= 1  # one bit of one element, after the load
        entry = [receiver.version, pieces is not None, receiver.verify_pending, None]
        if receiver.verify_pending:
            held = {k: v for k, v in engine.items() if not (receiver.version == lose_at and k == "big")}  # "big" not loaded
            try:
                receiver.verify(held, f"member {member}")
                entry[3] = "ok"
            except WeightChecksumError as e:
                entry[3] = str(e)
        log.append(entry)
    receiver.channel.store.add("done", 1)
    results.put((member, log))


def _run(interval: int, corrupt_at: int = -1, members: int = 3, staging: str = "auto", lose_at: int = -1) -> dict:
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_sender, args=(port_queue, members, interval, results, staging))]
    args = (members, port_queue, corrupt_at, results, lose_at)
    procs += [ctx.Process(target=_receiver, args=(m, *args)) for m in range(1, members)]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=120) for _ in range(members))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


@pytest.mark.parametrize("staging", ["device", "host"])
def test_pushes_are_verified_every_interval_only(staging):
    """Under either staging (distributed/weight_staging.py): the checksums are taken from the
    buckets as they go out, device buffers or copies of the host arena's."""
    out = _run(interval=2, staging=staging)
    for member in (1, 2):
        log = out[member]
        assert [v for v, *_ in log] == [1, 1, 2, 3, 4, 5]
        assert [changed for _, changed, *_ in log] == [True, False, True, True, True, True]
        # the checks ran on pushes 2 and 4 (the header-only send is not a push) and passed
        assert [(v, result) for v, _, _, result in log if result is not None] == [(2, "ok"), (4, "ok")]


def test_interval_zero_never_verifies():
    out = _run(interval=0, members=2)
    assert all(result is None and not pending for _, _, pending, result in out[1])


def test_a_changed_element_or_a_tensor_the_engine_lacks_is_named():
    """Push 4 loads with one bit changed; push 2 leaves out a tensor the trainer sent (an engine
    that maps the name elsewhere): each fails its check naming the tensor."""
    out = _run(interval=1, corrupt_at=4, members=2, lose_at=2)
    results = {v: r for v, changed, _, r in out[1] if changed}
    assert [results[v] for v in (1, 3, 5)] == ["ok"] * 3  # the pushes before and after still check out
    assert results[2].startswith("weight push 2 failed its checksum: in member 1, 1 sent tensors are not in it, first big.")
    message = results[4]
    assert message.startswith("weight push 4 failed its checksum: in member 1, 1 of 4 tensors differ")
    assert "first layers.0.w" in message
    assert "weight_checksum_interval=0 turns the check off" in message


def test_verify_names_a_tensor_the_engine_lacks_and_a_dtype_change():
    from hybridrl.distributed.weight_channel import _mismatch_message

    sent = {"a": [1], "b": [2]}
    loaded = {"a": torch.zeros(2, dtype=torch.float32)}
    msg = _mismatch_message(7, ["a", "b"], sent, loaded, "rank 0's engine", torch.bfloat16)
    assert "1 of 2 tensors differ from what the trainer sent, first a (a is held as torch.float32, sent as torch.bfloat16)" in msg
    assert "1 sent tensors are not in it, first b" in msg


# -- the rollout pool's worker: what its engine loaded, checked -----------------------------------
def _policy_sender(model_dir: str, port_queue, results) -> None:
    """The trainer's rank 0: the tiny policy twice (the second moved), each push verified."""
    from hybridrl.models.loading import load_causal_lm

    store, port = WeightChannel.host("127.0.0.1")
    port_queue.put(port)
    sender = WeightSender(WeightChannel("127.0.0.1", port, 0, 2, torch.device("cpu")), store, torch.float32, 1.0, 1)
    torch.manual_seed(1)
    model = load_causal_lm(model_dir, random_init=True)
    sender.send(model.named_parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    sender.send(model.named_parameters())
    sender.wait()
    results.put(dict((n, p.detach().clone()) for n, p in model.named_parameters()))
    while store.add("done", 0) < 1:
        time.sleep(0.05)


def test_rollout_worker_checks_what_its_engine_loaded(tiny_model_dir, arith_data, tmp_path):
    """workers/rollout.py on the native engine: push 1 loads and checks out (the metrics say so);
    push 2 is loaded with one bit changed inside the engine, and the generate stops naming it."""
    from hybridrl.config import config_from_dict
    from hybridrl.data import keys as K
    from hybridrl.data.batch import Batch
    from hybridrl.rollout import SamplingParams
    from hybridrl.workers.rollout import RolloutWorker

    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": tiny_model_dir, "random_init": True},
                "rollout": {"name": "native", "enforce_eager": True, "weight_checksum_interval": 1},
            },
            "trainer": {"device": "cpu", "default_local_dir": str(tmp_path / "run")},
        }
    )
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    sender = ctx.Process(target=_policy_sender, args=(tiny_model_dir, port_queue, results))
    sender.start()
    worker = RolloutWorker(cfg, None, torch.device("cpu"))
    worker.init_model(tiny_model_dir, True)
    worker.join_weight_channel("127.0.0.1", port_queue.get(timeout=120), 2)
    prompts = Batch({K.PROMPTS: torch.tensor([[5, 6, 7]]), K.PROMPT_MASK: torch.tensor([[1, 1, 1]])})
    sampling = SamplingParams(max_new_tokens=2)
    try:
        out = worker.generate(prompts, sampling, 1)
        metrics = out.meta[K.ROLLOUT_METRICS]
        assert metrics["rollout_pool/checksums_verified"] == 1.0 and metrics["rollout_pool/checksum_ms"] > 0

        name = "model.layers.0.mlp.up_proj.weight"
        load = worker.rollout.load_weights

        def load_then_flip_a_bit(pieces, **kw):
            load(pieces, **kw)
            dict(worker.rollout.model.named_parameters())[name].view(torch.int32)[2, 3] ^= 1

        worker.rollout.load_weights = load_then_flip_a_bit
        with pytest.raises(
            WeightChecksumError,
            match=(
                r"weight push 2 failed its checksum: in rollout rank 0's NativeRolloutEngine, "
                rf"1 of \d+ tensors differ from what the trainer sent, first {name}\."
            ),
        ):
            worker.generate(prompts, sampling, 2)
        sent = results.get(timeout=60)
        held = dict(worker.rollout.model.named_parameters())
        assert sum(not torch.equal(held[n], t) for n, t in sent.items()) == 1  # the flipped one, nothing else
    finally:
        worker.receiver.channel.store.add("done", 1)
        sender.join(timeout=60)
    assert sender.exitcode == 0


def _failing_sender(port_queue) -> None:
    """A sender whose checksums fail after its broadcasts (reading them to the host)."""
    import hybridrl.distributed.weight_channel as channel_module

    def broken(sums):
        raise MemoryError("no memory for the checksums")

    channel_module.on_host = broken
    store, port = WeightChannel.host("127.0.0.1")
    port_queue.put(port)
    sender = WeightSender(WeightChannel("127.0.0.1", port, 0, 2, torch.device("cpu")), store, torch.float32, 1.0, 1)
    sender.send(_tensors(1))
    try:
        sender.wait()
    except RuntimeError:
        pass
    while store.add("done", 0) < 1:
        time.sleep(0.05)


def test_a_sender_that_cannot_checksum_fails_the_receiver_at_once():
    """The receiver waits in the store for the sender's checksums: a failure there is published
    instead of leaving it to the store's 30-minute timeout."""
    ctx = mp.get_context("spawn")
    port_queue = ctx.Queue()
    proc = ctx.Process(target=_failing_sender, args=(port_queue,))
    proc.start()
    receiver = WeightReceiver(WeightChannel("127.0.0.1", port_queue.get(timeout=120), 1, 2, torch.device("cpu")))
    try:
        pieces = receiver.receive()
        engine = {name: t.clone() for name, t in pieces}
        assert receiver.verify_pending
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="weight push 1: the trainer failed to send it: MemoryError"):
            receiver.verify(engine)
        assert time.perf_counter() - t0 < 60
    finally:
        receiver.channel.store.add("done", 1)
        proc.join(timeout=60)
    assert proc.exitcode == 0
