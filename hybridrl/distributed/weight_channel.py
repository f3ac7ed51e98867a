"""Weights from the trainer to rollout replicas on devices of their own (resource_pool.rollout).

A `WeightChannel` is a process group apart from each pool's own: member 0 is the trainer's rank 0,
members 1..N the rollout pool's ranks (NCCL on GPUs, gloo on CPUs), built on a TCPStore that
member 0 hosts. The pools keep their own default groups; the channel's group is constructed
directly (`ProcessGroupNCCL` / `ProcessGroupGloo`) and used through its own `broadcast`.

Every rollout `generate` is paired with one `WeightSender.send` (the controller keeps the pairs,
trainer/rollout_pool.py, and tells each generate how many sends to have received before it
starts). Sends are counted in the store (`sent`), so that a receiver can also see, between two
decode steps, that weights wait (`available`: partial rollouts). A send is a header broadcast,
[version, changed, verify], then, when the policy changed since the last send, its tensors in
buckets of `bucket_mb`:

- the trainer's ranks gather the full tensors (FSDP: a collective, in step) and rank 0 copies
  them, cast to the wire dtype, into buckets on its device or in a host arena
  (distributed/weight_staging.py, `rollout.update_weights_staging`). The broadcasts then run in
  a background thread, so the trainer goes on with its next calls while the rollout pool is
  still generating; a next send first waits for the previous one to finish;
- the bucket layout (names, shapes, offsets) goes through the store; a receiver yields each
  bucket's tensors as it arrives, in a buffer of its own, so an engine may keep views.

A failure in the background thread (a receiver died, a timeout) is raised by the next send.

Verified pushes (`checksum_interval` N > 0): on pushes N, 2N, ... (counted by version) the sender
checksums each tensor as sent (in the wire dtype, on the device, distributed/weight_checksum.py)
and puts the sums in the store; each receiver checksums what its engine holds after loading
(`WeightReceiver.verify`) and raises `WeightChecksumError` naming the tensors that differ.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist

from hybridrl.distributed.weight_checksum import WeightChecksumError, checksum, checksums, differing, on_host
from hybridrl.distributed.weight_staging import Bucket, Staged, Stager, free_bytes

_LAYOUT_KEY, _SENT_KEY = "layout", "sent"


def _checksum_key(version: int) -> str:
    return f"checksums/{version}"


class WeightChannel:
    """One member's end of the channel: `member` 0 is the sender (and hosts the store)."""

    def __init__(self, addr: str, port: int, member: int, members: int, device: torch.device, timeout_s: float = 1800.0):
        self.member, self.members, self.device = member, members, device
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(addr, port, members, is_master=False, timeout=timeout, wait_for_workers=False)
        prefixed = dist.PrefixStore("hybridrl/weights", self.store)
        if device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(prefixed, member, members)
        else:
            self.group = dist.ProcessGroupGloo(prefixed, member, members, timeout)

    @staticmethod
    def host(addr: str, timeout_s: float = 1800.0) -> tuple[dist.TCPStore, int]:
        """The store of a new channel, on a free port of this process's host (member 0 calls it)."""
        store = dist.TCPStore(addr, 0, None, is_master=True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
        return store, store.port

    def broadcast(self, tensor: torch.Tensor) -> None:
        """`tensor` from member 0 to every member, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = 0, 0
        self.group.broadcast([tensor], opts).wait()


class WeightSender:
    """Member 0: stages the policy's tensors (distributed/weight_staging.py) and broadcasts them in
    the background."""

    def __init__(
        self,
        channel: WeightChannel,
        store: dist.TCPStore,
        dtype: torch.dtype,
        bucket_mb: float,
        checksum_interval: int = 0,
        staging: str = "auto",
        free: Callable[[torch.device], int | None] = free_bytes,
    ):
        """`checksum_interval`: verify pushes number N, 2N, ... (0: none). `staging`: device, host
        or auto (rollout.update_weights_staging); `free`: the device's free bytes for auto."""
        self.channel, self.store, self.dtype = channel, store, dtype
        bucket_numel = max(1, int(bucket_mb * 2**20) // torch.empty((), dtype=dtype).element_size())
        self.stager = Stager(staging, channel.device, dtype, bucket_numel, free)
        self.checksum_interval = checksum_interval
        self._published: list[int] = []  # verified pushes whose checksums are still in the store
        self.version = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def wait(self) -> None:
        """Until the previous send has reached every receiver; re-raises its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"sending the weights to the rollout pool failed: {error}") from error

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | None, numel: int | None = None) -> dict[str, float]:
        """Stage `named_tensors` (None: the policy did not change) and start the broadcasts. Returns
        before the receivers have them, with the push's metrics (none for a header-only send).
        `numel`: the policy's elements, when the caller knows them (auto staging's first choice)."""
        self.wait()
        staged: Staged | None = None
        if named_tensors is not None:
            self.version += 1
            staged = self.stager.stage(named_tensors, numel)
            self.store.set(_LAYOUT_KEY, _layout_json(self.dtype, staged.buckets))
        self.store.add(_SENT_KEY, 1)  # after the layout: a receiver that sees the count finds it
        verify = staged is not None and self.checksum_interval > 0 and self.version % self.checksum_interval == 0
        header = torch.tensor([self.version, 0 if staged is None else 1, int(verify)], dtype=torch.long)
        args = (header, staged, verify)
        self._thread = threading.Thread(target=self._broadcast, args=args, name="hybridrl-weights", daemon=True)
        self._thread.start()
        if staged is None:
            return {}
        return {"rollout_pool/bytes_sent": float(staged.nbytes), "rollout_pool/device_staging": float(staged.staging == "device")}

    def _broadcast(self, header: torch.Tensor, staged: Staged | None, verify: bool) -> None:
        """The header and the buckets; for a verified push also each tensor's checksum, taken from
        the bucket on the device just before it goes out. On a GPU all of it runs on a stream of
        this thread's that first waits for the staging copies (`Staged.ready`); the buckets are
        released once that stream has finished (the broadcasts read them until then)."""
        device, stream = self.channel.device, None
        try:
            stream = torch.cuda.Stream(device) if device.type == "cuda" else None
            sums, timer = {}, _Timer(stream)
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                self.channel.broadcast(header.to(device))
                if staged is not None and staged.ready is not None:
                    stream.wait_event(staged.ready)
                for i, bucket in enumerate(staged.buckets if staged is not None else ()):
                    flat = staged.flat(i, device)
                    if verify:
                        with timer:
                            for name, shape, offset, n in bucket.entries:
                                sums[name] = checksum(flat[offset : offset + n])
                    self.channel.broadcast(flat)
                if verify:
                    with timer:
                        sent = on_host(sums)  # one read to the host
                if stream is not None:
                    stream.synchronize()
            if verify:
                self._publish(int(header[0]), sent, timer.ms())
        except BaseException as e:  # raised by the next send
            self._error = e
            if stream is not None:  # nothing may still read the buckets when they are released
                try:
                    stream.synchronize()
                except Exception:
                    pass
            if verify:  # the receivers wait for these checksums: tell them there are none
                try:
                    self.store.set(_checksum_key(int(header[0])), json.dumps({"error": repr(e)}))
                except Exception:
                    pass
        finally:
            if staged is not None:
                staged.release()

    def _publish(self, version: int, sent: dict[str, list[int]], ms: float) -> None:
        """The checksums of push `version` for the receivers; those of earlier pushes that every
        receiver has read (each counts itself in `<key>/read`) leave the store."""
        self.store.set(_checksum_key(version), json.dumps({"sums": sent, "ms": ms}))
        for old in list(self._published):
            key = _checksum_key(old)
            if self.store.add(f"{key}/read", 0) == self.channel.members - 1:
                self.store.delete_key(key)
                self.store.delete_key(f"{key}/read")
                self._published.remove(old)
        self._published.append(version)


class _Timer:
    """Milliseconds spent inside `with timer:` blocks: CUDA events on `stream`, else the host clock."""

    def __init__(self, stream):
        self.stream, self.events, self.host_s = stream, [], 0.0

    def __enter__(self):
        if self.stream is not None:
            self.events.append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
            self.events[-1][0].record(self.stream)
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.stream is not None:
            self.events[-1][1].record(self.stream)
        self.host_s += time.perf_counter() - self.t0

    def ms(self) -> float:
        """After the work has finished (its stream synchronized)."""
        if self.stream is None:
            return self.host_s * 1e3
        return sum(a.elapsed_time(b) for a, b in self.events)


class WeightReceiver:
    """Members 1..N: the other end of each send."""

    def __init__(self, channel: WeightChannel):
        self.channel = channel
        self.version = 0
        self.received = 0  # sends received so far
        self.verify_pending = False  # the last receive was a verified push: `verify` what was loaded
        self.names: list[str] = []  # the tensors of the last push, in order
        self.dtype: torch.dtype | None = None  # their dtype on the wire

    def available(self) -> int:
        """Sends staged by the sender and not received here yet (a store read, no broadcast)."""
        return self.channel.store.add(_SENT_KEY, 0) - self.received

    def receive(self) -> Iterator[tuple[str, torch.Tensor]] | None:
        """None when the policy did not change; else its (name, tensor) pairs, received bucket by
        bucket as the iterator is consumed. The caller must exhaust the iterator before the next
        `receive` (`drain`)."""
        device = self.channel.device
        header = torch.zeros(3, dtype=torch.long, device=device)
        self.channel.broadcast(header)
        version, changed, verify = header.tolist()
        self.version = version
        self.received += 1
        self.verify_pending = bool(verify)
        if not changed:
            return None
        dtype, buckets = _layout_from_json(self.channel.store.get(_LAYOUT_KEY))
        self.names, self.dtype = [name for b in buckets for name, *_ in b.entries], dtype
        return self._pieces(dtype, buckets)

    def verify(self, loaded: dict[str, torch.Tensor], where: str = "the rollout engine") -> dict[str, float]:
        """After a verified push was loaded (`verify_pending`): the checksum of each pushed tensor
        as `loaded` (name -> the engine's tensor) holds it against the sender's; raises
        `WeightChecksumError` naming the first that differ. Returns both sides' checksum times (ms)."""
        t0 = time.perf_counter()
        got = checksums((name, loaded[name]) for name in self.names if name in loaded)
        ms = (time.perf_counter() - t0) * 1e3
        self.verify_pending = False
        key = _checksum_key(self.version)
        sent = json.loads(self.channel.store.get(key))  # waits for the sender's
        self.channel.store.add(f"{key}/read", 1)
        if "error" in sent:
            raise RuntimeError(f"weight push {self.version}: the trainer failed to send it: {sent['error']}")
        bad = differing(sent["sums"], got)
        if bad:
            raise WeightChecksumError(_mismatch_message(self.version, bad, sent["sums"], loaded, where, self.dtype))
        return {"receiver_ms": ms, "sender_ms": float(sent["ms"])}

    def _pieces(self, dtype, buckets: list[Bucket]) -> Iterator[tuple[str, torch.Tensor]]:
        for bucket in buckets:
            flat = torch.empty(bucket.numel, dtype=dtype, device=self.channel.device)
            self.channel.broadcast(flat)
            for name, shape, offset, n in bucket.entries:
                yield name, flat[offset : offset + n].view(shape)


def _mismatch_message(version: int, bad: list[str], sent: dict, loaded: dict, where: str, dtype) -> str:
    missing = [n for n in bad if n not in loaded]
    differ = [n for n in bad if n in loaded]
    parts = []
    if differ:
        cast = [n for n in differ if loaded[n].dtype != dtype]
        held = f" ({cast[0]} is held as {loaded[cast[0]].dtype}, sent as {dtype})" if cast else ""
        first = ", ".join(differ[:3])
        parts.append(f"{len(differ)} of {len(sent)} tensors differ from what the trainer sent, first {first}{held}")
    if missing:
        parts.append(f"{len(missing)} sent tensors are not in it, first {', '.join(missing[:3])}")
    return (
        f"weight push {version} failed its checksum: in {where}, {'; '.join(parts)}. The rollout pool would "
        "sample from weights other than the policy's: check the engine's load_weights for these names "
        "(a dtype or layout change, a name it maps elsewhere) and the devices for memory errors. "
        "actor_rollout_ref.rollout.weight_checksum_interval=0 turns the check off."
    )


def _layout_json(dtype: torch.dtype, buckets: list[Bucket]) -> str:
    """The bucket layout as JSON: plain data, never a pickle read from the network."""
    return json.dumps({"dtype": str(dtype).removeprefix("torch."), "buckets": [[b.numel, b.entries] for b in buckets]})


def _layout_from_json(raw: bytes) -> tuple[torch.dtype, list[Bucket]]:
    """
    >>> _layout_from_json(_layout_json(torch.bfloat16, [Bucket(6, [("w", (2, 3), 0, 6)])]))
    (torch.bfloat16, [Bucket(numel=6, entries=[('w', (2, 3), 0, 6)])])
    """
    data = json.loads(raw)
    dtype = getattr(torch, data["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"weight channel: {data['dtype']!r} is not a torch dtype")
    buckets = [Bucket(n, [(name, tuple(shape), off, k) for name, shape, off, k in entries]) for n, entries in data["buckets"]]
    return dtype, buckets


def drain(pieces: Iterator | None) -> None:
    """Receive what a consumer left (the broadcasts must all be matched)."""
    for _ in pieces or ():
        pass
