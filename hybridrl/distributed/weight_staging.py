"""Where the trainer's rank 0 keeps a weight push until the rollout pool has it (weight_channel.py).

A push is the policy's tensors, cast to the wire dtype, packed into buckets of at most
`bucket_numel` elements (a larger tensor alone in a bucket of its own). The trainer stages them
and returns; the sender's background thread broadcasts the buckets whenever the receivers join
(in one_step_off / async modes the pool may still be generating). Two places to keep them:

- `DeviceStaging`: one buffer per bucket on the trainer's device, each tensor a `copy_` into its
  slice. No host round trip; costs the policy's size in the wire dtype on the device until the
  broadcasts are done (then the buffers are freed).
- `HostStaging`: one buffer per bucket in host memory (pinned on GPUs), allocated on the first
  push and reused by the next ones (grown when a bucket needs more). Frees the device while the
  receivers are busy; each bucket goes back to the device when it is broadcast.

On a GPU the copies are enqueued on the trainer's current stream and a CUDA event is recorded
after them; the broadcasting stream waits on that event, so neither side synchronizes the
device. On the CPU the same code runs with plain memory.

`Stager` picks one per push (`actor_rollout_ref.rollout.update_weights_staging`): auto = device
when the push fits in half of the device's free memory at send time, else host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from hybridrl.config.names import WEIGHT_STAGINGS


@dataclass
class Bucket:
    """One broadcast's layout: its element count and its tensors."""

    numel: int = 0
    entries: list[tuple[str, tuple[int, ...], int, int]] = field(default_factory=list)  # name, shape, offset, numel


@dataclass
class Staged:
    """One push, staged: its bucket layout and each bucket's buffer (capacity >= its numel)."""

    staging: str  # "device" or "host"
    buckets: list[Bucket]
    buffers: list[torch.Tensor]
    ready: torch.cuda.Event | None  # recorded on the trainer's stream after the copies (None on the CPU)
    nbytes: int  # the push's bytes in the wire dtype

    def flat(self, i: int, device: torch.device) -> torch.Tensor:
        """Bucket `i` on `device`, to broadcast: the device buffer itself, or a copy of the host one
        (asynchronous from pinned memory, on the caller's stream, which must wait on `ready` first)."""
        return self.buffers[i][: self.buckets[i].numel].to(device, non_blocking=True)

    def release(self) -> None:
        """After the broadcasts have finished on the device: device buckets are freed here (a
        host arena stays with its `HostStaging`)."""
        self.buffers = []


class _Staging:
    """The packing both stagings share; a subclass says where a bucket's buffer comes from."""

    name = ""

    def __init__(self, device: torch.device, dtype: torch.dtype, bucket_numel: int):
        self.device, self.dtype, self.bucket_numel = device, dtype, bucket_numel

    def _buffer(self, i: int, numel: int) -> torch.Tensor:
        raise NotImplementedError

    def stage(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Staged:
        buckets: list[Bucket] = []
        buffers: list[torch.Tensor] = []
        for name, tensor in named_tensors:
            n = tensor.numel()
            if not buckets or (buckets[-1].numel and buckets[-1].numel + n > self.bucket_numel):
                buckets.append(Bucket())
                buffers.append(self._buffer(len(buffers), max(n, self.bucket_numel)))
            bucket = buckets[-1]
            # a cast and a copy on the current stream (asynchronous D2D, or D2H into pinned memory)
            buffers[-1][bucket.numel : bucket.numel + n].copy_(tensor.detach().reshape(-1), non_blocking=True)
            bucket.entries.append((name, tuple(tensor.shape), bucket.numel, n))
            bucket.numel += n
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        nbytes = sum(b.numel for b in buckets) * torch.empty((), dtype=self.dtype).element_size()
        return Staged(self.name, buckets, buffers, ready, nbytes)


class DeviceStaging(_Staging):
    """Buckets allocated on the device for one push, freed once it is broadcast."""

    name = "device"

    def _buffer(self, i: int, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=self.dtype, device=self.device)


class HostStaging(_Staging):
    """Buckets in a host arena kept across pushes: pinned on GPUs (for asynchronous copies both
    ways), plain memory on the CPU. A push writes every element it sends, so nothing of an
    earlier push goes out (buckets are sliced to their numel when sent)."""

    name = "host"

    def __init__(self, device: torch.device, dtype: torch.dtype, bucket_numel: int):
        super().__init__(device, dtype, bucket_numel)
        self.arena: list[torch.Tensor] = []  # bucket i's buffer
        self.allocations = 0  # host buffers allocated so far (the arena is reused: tests read it)

    def _buffer(self, i: int, numel: int) -> torch.Tensor:
        if i < len(self.arena) and self.arena[i].numel() >= numel:
            return self.arena[i]
        buf = torch.empty(numel, dtype=self.dtype, pin_memory=self.device.type == "cuda")
        self.allocations += 1
        if i < len(self.arena):
            self.arena[i] = buf
        else:
            self.arena.append(buf)
        return buf


def free_bytes(device: torch.device) -> int | None:
    """What a new allocation on `device` may take now; None on the CPU (no budget to keep).
    The driver's free memory plus what PyTorch's caching allocator holds unused (it hands that
    out first, and releases it to the driver before it reports out of memory)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class Stager:
    """Stages each push where `mode` says (`update_weights_staging`): device, host, or auto."""

    def __init__(
        self,
        mode: str,
        device: torch.device,
        dtype: torch.dtype,
        bucket_numel: int,
        free: Callable[[torch.device], int | None] = free_bytes,
    ):
        """`free`: the device's free bytes now (None: no budget); injectable for tests."""
        if mode not in WEIGHT_STAGINGS:
            raise ValueError(f"update_weights_staging={mode!r} is not one of {', '.join(WEIGHT_STAGINGS)}")
        self.mode, self.device, self.free = mode, device, free
        stagings = (DeviceStaging(device, dtype, bucket_numel), HostStaging(device, dtype, bucket_numel))
        self.stagings = {s.name: s for s in stagings}
        self.element_size = torch.empty((), dtype=dtype).element_size()
        self.last_numel: int | None = None  # the last push's elements

    def choose(self, numel: int | None = None) -> str:
        """The staging of the next push. auto: device when the push (the last push's size, else
        `numel`, the caller's estimate) fits in half of the device's free memory, so the trainer
        keeps the other half while the receivers have not joined; host when it does not, or when
        its size is not known yet on a GPU."""
        if self.mode != "auto":
            return self.mode
        budget = self.free(self.device)
        if budget is None:
            return "device"
        numel = self.last_numel if self.last_numel is not None else numel
        if numel is None:
            return "host"
        return "device" if numel * self.element_size <= budget // 2 else "host"

    def stage(self, named_tensors: Iterable[tuple[str, torch.Tensor]], numel: int | None = None) -> Staged:
        staged = self.stagings[self.choose(numel)].stage(named_tensors)
        self.last_numel = sum(b.numel for b in staged.buckets)
        return staged
