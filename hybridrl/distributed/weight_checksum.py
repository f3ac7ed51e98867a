"""Checksums of weights on their device: did the rollout pool load what the trainer sent?

A tensor's checksum is computed from its bits, never its values, so it is the same on every
device and rank (no float rounding, no reduction-order effects). The tensor is read as 16-bit
words (`int16` view; 1-byte dtypes as bytes): k words per element, word column c of element i
is w[i, c]. For each column,

    S_c = sum_i (i + 1) * w[i, c]   mod P,   P = 2**31 - 1 (a prime)

in exact arithmetic (blocks of 2**15 elements keep each block's sums exact in a float64 matmul,
the rest is int64 below 2**63). Because P is prime and larger than both any position difference
(tensors under 2**31 elements) and any word difference (under 2**16):
- one changed element changes some S_c by (i + 1) * d, never 0 mod P;
- two swapped elements of different bits change S_c by (i - j) * (w[j, c] - w[i, c]), never 0;
- tensors that trade names, or a transposed tensor, show under their names (one checksum per name).
Cost on a GPU: per chunk of `chunk_elems` elements, a float64 copy of its words and one matmul
with a (block * k, 2 * k) matrix, then a few small int64 ops per block; no host copy of the
weights, and the host reads the k numbers of every tensor in one transfer.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import torch

P = 2**31 - 1
BLOCK = 2**15  # elements per row: a row's weighted sum stays below 2**45 (exact in float64)
CHUNK = 2**24  # elements per pass: bounds the float64 temporary (128 MB a word column)


class WeightChecksumError(RuntimeError):
    """The rollout engine holds weights other than those the trainer sent."""


def words(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bits as (numel, k) signed integers: 16-bit words (bytes for 1-byte dtypes)."""
    flat = t.detach().contiguous().reshape(-1)
    size = flat.element_size()
    word = torch.int8 if size == 1 else torch.int16
    return flat.view(word).view(flat.numel(), max(1, size // 2))


def checksum(t: torch.Tensor, *, block: int = BLOCK, chunk_elems: int = CHUNK) -> torch.Tensor:
    """(k,) int64 on `t`'s device: S_c of every word column (module docstring), in [0, P).

    Element i sits in row r = i // block at column j = i % block, so (i + 1) = r * block + (j + 1):
    per row, A_r = sum_j (j + 1) * w and B_r = sum_j w, both in one float64 matmul that is exact
    (integers below 2**45, whatever the summation order); S_c = sum_r (A_r + r * block * (B_r mod
    P)) mod P in int64, each product below 2**62."""
    if t.numel() >= P:
        raise ValueError(f"checksum: a tensor of {t.numel()} elements (at most {P - 1})")
    w = words(t)  # (N, k)
    n, k = w.shape
    device = w.device
    total = torch.zeros(k, dtype=torch.int64, device=device)
    weights = _weights(block, k, device)
    rows_per_chunk = max(1, chunk_elems // block)
    for start in range(0, n, rows_per_chunk * block):
        end = min(n, start + rows_per_chunk * block)
        full = (end - start) // block  # whole rows in this chunk
        parts = []
        if full:
            parts.append((w[start : start + full * block].view(full, block, k), start // block))
        if start + full * block < end:  # the tensor's last, shorter row
            parts.append((w[start + full * block : end].unsqueeze(0), start // block + full))
        for x, first_row in parts:  # x: (R, width, k)
            rows, width = x.shape[0], x.shape[1]
            ab = (x.reshape(rows, width * k).to(torch.float64) @ weights[: width * k]).to(torch.int64).view(rows, 2, k)
            shift = (first_row + torch.arange(rows, device=device)).mul_(block).unsqueeze(1)  # (R, 1), below P
            total += (ab[:, 0] + shift * ab[:, 1].remainder(P)).remainder(P).sum(0)
    return total.remainder(P)


@functools.lru_cache(maxsize=16)
def _weights(block: int, k: int, device: torch.device) -> torch.Tensor:
    """(block * k, 2 * k) float64: row j * k + c holds (j + 1, 1) in columns c and k + c, so that a
    row of words (j, c) laid out as in memory times it gives [A_c..., B_c...] without a transpose."""
    j = torch.arange(1, block + 1, dtype=torch.float64, device=device)
    w = torch.kron(torch.stack([j, torch.ones_like(j)], dim=1), torch.eye(k, dtype=torch.float64, device=device))
    if device.type == "cuda":  # cached: written before any stream reads it
        torch.cuda.current_stream(device).synchronize()
    return w


def checksums(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list[int]]:
    """{name: its checksum as ints}, read to the host in one transfer per device."""
    return on_host({name: checksum(t) for name, t in named})


def on_host(sums: Mapping[str, torch.Tensor]) -> dict[str, list[int]]:
    """Checksums computed on devices (`checksum`'s tensors) as ints, one transfer per device."""
    names, sums = list(sums), list(sums.values())
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(sums):
        by_device.setdefault(s.device, []).append(i)
    out: list[list[int]] = [[] for _ in sums]
    for idx in by_device.values():
        flat = torch.cat([sums[i] for i in idx]).tolist()
        at = 0
        for i in idx:
            k = sums[i].numel()
            out[i], at = flat[at : at + k], at + k
    return dict(zip(names, out))


def reference_checksum(t: torch.Tensor) -> list[int]:
    """The same number with Python integers, element by element (tests)."""
    w = words(t.cpu()).tolist()
    k = max(1, t.element_size() // 2)
    return [sum((i + 1) * row[c] for i, row in enumerate(w)) % P for c in range(k)]


def differing(sent: Mapping[str, list[int]], loaded: Mapping[str, list[int] | None]) -> list[str]:
    """Names whose loaded checksum is missing (None) or differs from the sent one, in sent order."""
    return [name for name, s in sent.items() if loaded.get(name) != s]
