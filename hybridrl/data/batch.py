"""`Batch`: the only thing that crosses a stage (and later a process) boundary.

Tensors share a leading batch dimension; non-tensor fields are numpy object arrays of the same
length (strings, dicts); `meta` holds scalars that describe the whole batch. Field names are
the constants in `hybridrl.data.keys`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensors: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.non_tensors = {k: _as_object_array(v) for k, v in self.non_tensors.items()}
        self._check_lengths()

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def concat(cls, batches: Sequence["Batch"]) -> "Batch":
        """Concatenate along the batch dimension; `meta` is taken from the first batch."""
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        first = batches[0]
        for b in batches[1:]:
            if b.tensors.keys() != first.tensors.keys() or b.non_tensors.keys() != first.non_tensors.keys():
                raise ValueError(f"cannot concat batches with different keys: {sorted(first.keys())} vs {sorted(b.keys())}")
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches]) for k in first.non_tensors}
        return cls(tensors, non_tensors, dict(first.meta))

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.tensors.values():
            return v.shape[0]
        for v in self.non_tensors.values():
            return len(v)
        return 0

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, key: str):
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensors:
            return self.non_tensors[key]
        raise KeyError(f"batch has no field {key!r}; it has {self.keys()}")

    def __setitem__(self, key: str, value) -> None:
        if isinstance(value, torch.Tensor):
            self.non_tensors.pop(key, None)
            self.tensors[key] = value
        else:
            self.tensors.pop(key, None)
            self.non_tensors[key] = _as_object_array(value)
        self._check_lengths()

    def update(self, other: "Batch") -> "Batch":
        """Add (or overwrite) the fields and meta of `other`, which must have the same length."""
        if len(other) != len(self) and other.keys():
            raise ValueError(f"cannot merge a batch of {len(other)} rows into one of {len(self)}")
        self.tensors.update(other.tensors)
        self.non_tensors.update(other.non_tensors)
        self.meta.update(other.meta)
        return self

    # -- reshaping -----------------------------------------------------------------------------
    def select(self, keys: Iterable[str]) -> "Batch":
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"batch has no field(s) {missing}; it has {self.keys()}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensors.items() if k in keys},
            dict(self.meta),
        )

    def index(self, idx) -> "Batch":
        """Rows `idx` (a slice, a list/array/tensor of positions) in that order."""
        if isinstance(idx, slice):
            t_idx = n_idx = idx
        else:
            t_idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
            n_idx = t_idx.numpy()
        return Batch(
            {k: v[t_idx] for k, v in self.tensors.items()},
            {k: v[n_idx] for k, v in self.non_tensors.items()},
            dict(self.meta),
        )

    def split(self, size: int) -> list["Batch"]:
        """Consecutive chunks of `size` rows (the last one may be smaller)."""
        if size <= 0:
            raise ValueError(f"split size must be positive, got {size}")
        return [self.index(slice(i, i + size)) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list["Batch"]:
        """`n` consecutive chunks of equal size; `len(self)` must divide by `n` (pad first)."""
        if n <= 0 or len(self) % n:
            raise ValueError(f"cannot chunk {len(self)} rows into {n} equal parts; pad the batch first")
        return self.split(len(self) // n)

    def repeat_interleave(self, n: int) -> "Batch":
        """Each row repeated `n` times in place: [a, b] -> [a, a, b, b] for n=2."""
        idx = np.repeat(np.arange(len(self)), n)
        return self.index(idx)

    def pad_to_multiple(self, k: int) -> tuple["Batch", int]:
        """Repeat leading rows so that the length divides by `k`; returns (batch, rows added)."""
        pad = (-len(self)) % k
        if pad == 0:
            return self, 0
        idx = np.concatenate([np.arange(len(self)), np.arange(pad) % len(self)])
        return self.index(idx), pad

    def to(self, device) -> "Batch":
        return Batch({k: to_device(v, device) for k, v in self.tensors.items()}, self.non_tensors, dict(self.meta))

    def _check_lengths(self) -> None:
        lengths = {k: v.shape[0] for k, v in self.tensors.items()}
        lengths.update({k: len(v) for k, v in self.non_tensors.items()})
        if len(set(lengths.values())) > 1:
            raise ValueError(f"batch fields have different lengths: {lengths}")


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device`. A host tensor bound for a GPU goes through pinned memory without blocking:
    the copy queues behind the device's work instead of the host waiting for that work to end
    (a plain copy from pageable memory waits, and the device then idles while the host queues
    the next kernels)."""
    if t.device.type == "cpu" and torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _as_object_array(values) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def pad_sequence_layout(t: torch.Tensor, prompt_width: int, to_prompt: int, to_response: int, fill) -> torch.Tensor:
    """A (B, P + R, ...) tensor aligned with left-padded prompts | right-padded responses (P =
    `prompt_width`), padded with `fill` to (B, to_prompt + to_response, ...): on the left of the
    prompt part, on the right of the response part (ROUTED_EXPERTS when batches are concatenated)."""

    def fill_(width: int) -> torch.Tensor:
        return t.new_full((t.shape[0], width, *t.shape[2:]), fill)

    prompt, response = t[:, :prompt_width], t[:, prompt_width:]
    return torch.cat([fill_(to_prompt - prompt_width), prompt, response, fill_(to_response - response.shape[1])], 1)
