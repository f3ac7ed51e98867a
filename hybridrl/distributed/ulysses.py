"""Ulysses sequence parallelism: one packed row split over `sp` ranks, heads split around attention.

A training pass with `ulysses_sequence_parallel_size = sp` gives the sp ranks of a data-parallel
group the same micro-batch. Each rank runs the model on 1/sp of the packed row's tokens (the
row is padded to a multiple of sp); everything but attention is per token, so it needs nothing
from the others. Around attention, an all-to-all trades the sequence split for a head split:
q, k, v (N/sp tokens, all H heads) -> (all N tokens, H/sp heads), attention runs over whole
sequences (the packed row's boundaries are the same on every rank), and the inverse all-to-all
brings the output back to (N/sp tokens, H heads). With fewer key/value heads than sp (GQA),
k and v are expanded to one head per query-head group first, so every rank has the key/value
heads its query heads read.

The final hidden states are all-gathered into the whole row, so log-probs, entropy, values and
the loss are computed exactly as without sp, identically on the sp ranks. The gather's backward
sums the ranks' (identical) gradients and keeps the rank's slice: each rank's parameter gradient
is then sp x its share, and FSDP's average over all world = dp x sp ranks, with the loss
normalizers divided by the world (`fsdp.dp_normalizer`), is the single-device gradient.
"""

from __future__ import annotations

import torch.distributed as dist

from hybridrl.distributed.layout import active, global_rank

_groups: dict[tuple[int, int], object] = {}


def sp_group():
    """This rank's sequence-parallel process group (ranks [k * sp, (k + 1) * sp)), or None at sp = 1.
    Created on first use, on every rank at the same point (the first training pass): every rank
    of the process group must call it."""
    layout = active()
    if layout.sp == 1 or not dist.is_initialized():
        return None
    key = (layout.world, layout.sp)
    if key not in _groups:
        mine = None
        for first in range(0, layout.world, layout.sp):
            group = dist.new_group(list(range(first, first + layout.sp)))
            if first <= global_rank() < first + layout.sp:
                mine = group
        _groups[key] = mine
    return _groups[key]
