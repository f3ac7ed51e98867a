"""How a worker method's input is spread over a group's ranks and its outputs gathered.

A worker class marks its public methods with `@register(Dispatch.DP)` etc.; a worker group
(the in-process one for one device, the Ray one for several) reads the mark and applies
`split_inputs` / `collect_outputs`, so the controller calls `group.method(batch)` and never
sees ranks.

A DP method is split over a named dimension of the role's parallel layout (config/layout.py):
"dp" (the default: training data parallel, world / sp shards; the sp ranks of a group get the
same shard) or "rollout" (one shard per rollout replica of tp ranks). The ranks that share a
shard compute the same answer, so one output per shard is kept (its first rank's).

Metrics: a DP method that returns a dict of numbers gets the mean over ranks. Workers make
that mean the global value: their loss terms are normalized with `fsdp.dp_normalizer` (the
global count / dp size), so each rank's loss is dp x its share and the mean is the total;
gradient norms are already global (the same on every rank).
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Callable

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch

DISPATCH_ATTR = "_hybridrl_dispatch"


class Dispatch(enum.Enum):
    ALL = "all"  # every rank gets the same input; all outputs are returned
    DP = "dp"  # the Batch is split over data-parallel ranks; outputs concatenated in order
    RANK0 = "rank0"  # every rank runs it (SPMD), only rank 0's output is kept


MESHES = ("dp", "rollout")  # the layout dimensions a DP method can be split over (ParallelLayout.groups)


def register(mode: Dispatch, mesh: str = "dp") -> Callable:
    """Mark a worker method with its dispatch mode; for DP, `mesh` names the layout dimension
    the batch is split over ("dp", or "rollout" for generation). While a profiler runs, each call
    is recorded as the range `hybridrl/<method>`."""
    if mesh not in MESHES:
        raise ValueError(f"register: unknown mesh {mesh!r}; use one of {MESHES}")

    def mark(fn):
        label = f"hybridrl/{fn.__name__}"

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            # Under trainer.profile_steps the call is a named range in the trace (CPU and GPU
            # timelines), so benchmarks/trace_summary.py can split a step by worker method.
            if not getattr(torch.autograd.profiler, "_is_profiler_enabled", False):
                return fn(*args, **kwargs)
            with torch.profiler.record_function(label):
                return fn(*args, **kwargs)

        setattr(traced, DISPATCH_ATTR, (mode, mesh))
        return traced

    return mark


def dispatch_mode(fn) -> Dispatch | None:
    mark = getattr(fn, DISPATCH_ATTR, None)
    return mark[0] if mark else None


def dispatch_mesh(fn) -> str:
    """The layout dimension a DP method is split over."""
    mark = getattr(fn, DISPATCH_ATTR, None)
    return mark[1] if mark else "dp"


def split_inputs(mode: Dispatch, groups: int | list[int], args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], int]:
    """Per-rank (args, kwargs) and the number of padding rows added to each Batch argument.

    `groups`: for each rank, the shard it gets (`ParallelLayout.groups(mesh)`, e.g. [0, 0, 1, 1]
    with sp = 2 on 4 ranks), or a world size (every rank its own shard).
    DP: every `Batch` argument is padded to a multiple of the number of shards (leading rows
    repeated at the end) and cut into that many consecutive chunks; rank r gets chunk
    groups[r]. Other arguments go to every rank unchanged.
    """
    groups = list(range(groups)) if isinstance(groups, int) else list(groups)
    world, shards = len(groups), max(groups) + 1
    if mode is not Dispatch.DP or shards == 1:
        return [args] * world, [kwargs] * world, 0
    pads = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, Batch)}
    if len(pads) > 1:
        raise ValueError(f"a DP method got Batch arguments of different lengths {sorted(pads)}")

    def chunks(v):
        return v.pad_to_multiple(shards)[0].chunk(shards) if isinstance(v, Batch) else [v] * shards

    arg_chunks = [chunks(a) for a in args]
    kw_chunks = {k: chunks(v) for k, v in kwargs.items()}
    pad = (-pads.pop()) % shards if pads else 0
    per_args = [tuple(c[g] for c in arg_chunks) for g in groups]
    per_kwargs = [{k: c[g] for k, c in kw_chunks.items()} for g in groups]
    return per_args, per_kwargs, pad


def collect_outputs(mode: Dispatch, outputs: list, pad: int, groups: list[int] | None = None) -> Any:
    """One result from the per-rank results, in rank order (see the module docstring).
    DP with `groups` (as given to `split_inputs`): the first rank's output of each shard."""
    if mode is Dispatch.RANK0:
        return outputs[0]
    if mode is Dispatch.ALL:
        return outputs
    if groups is not None:
        first_of = {}
        for rank, g in enumerate(groups):
            first_of.setdefault(g, rank)
        outputs = [outputs[first_of[g]] for g in sorted(first_of)]
    first = outputs[0]
    if isinstance(first, Batch):
        out = Batch.concat(_common_width(outputs))
        return out.index(slice(0, len(out) - pad)) if pad else out
    if isinstance(first, dict):
        if pad:
            # Padding rows are copies of real ones: fine for outputs per row, wrong for an
            # update, which would train on them twice.
            raise ValueError(
                f"a DP method returning metrics got a batch that needed {pad} padding rows; "
                "its batch size must divide by the data-parallel size"
            )
        return {k: sum(o[k] for o in outputs) / len(outputs) for k in first}
    if first is None:
        return None
    return outputs


def _common_width(outputs: list[Batch]) -> list[Batch]:
    """Right-pad (B, R, ...) tensors whose R differs between ranks to the widest rank's.

    Each rank's generation ends at its own longest response, so RESPONSES and the tensors
    aligned with it come back ragged; one device would have padded them to the longest of
    all, which is what this gives (token ids with the prompts' pad id, everything else 0).
    """
    ragged = [k for k, v in outputs[0].tensors.items() if v.dim() >= 2 and len({o.tensors[k].shape[1] for o in outputs}) > 1]
    if not ragged:
        return outputs
    pad_id = outputs[0].meta.get(K.PAD_TOKEN_ID, 0)
    padded = []
    for o in outputs:
        tensors = dict(o.tensors)
        for k in ragged:
            width = max(x.tensors[k].shape[1] for x in outputs)
            t = tensors[k]
            fill = pad_id if not t.is_floating_point() and t.dtype != torch.bool else 0
            fill = K.NO_EXPERT if k == K.ROUTED_EXPERTS else fill  # (B, P + R, L, k): P is the same on every rank
            extra = t.new_full((t.shape[0], width - t.shape[1], *t.shape[2:]), fill)
            tensors[k] = torch.cat([t, extra], dim=1)
        padded.append(Batch(tensors, o.non_tensors, o.meta))
    return padded
