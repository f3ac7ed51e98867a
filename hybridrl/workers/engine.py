"""The training engine: one model on its device(s) and everything a trainable role does with it.

Each role holds one: the actor's policy, the frozen reference, the critic (and later the reward
model). The engine loads nothing itself and knows no loss: the role hands it a placed model's
forward pass (`hybridrl.workers.forward`) and, for an update, an objective
(`hybridrl.workers.objectives`): the epoch -> mini-batch -> micro-batch loop, the loss
normalizers, gradient accumulation, the guarded optimizer step, checkpoints and perf metrics
are written once, here, for all of them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Protocol

import torch

from hybridrl.data import keys as K
from hybridrl.data.batch import Batch
from hybridrl.data.token_batching import micro_batches, restore_order, sequence_lengths
from hybridrl.distributed import checkpoint as dckpt
from hybridrl.distributed.expert_parallel import reduce_expert_gradients
from hybridrl.distributed.fsdp import accumulation, clip_grad_norm, dp_max_min, dp_normalizer
from hybridrl.distributed.layout import active
from hybridrl.distributed.parallelize import parallelize
from hybridrl.distributed.replicate import average_gradients
from hybridrl.models import graphs as decoder_graphs
from hybridrl.models import moe_block
from hybridrl.models.packing import base_model
from hybridrl.tracking import perf
from hybridrl.workers.forward import pack_on_host
from hybridrl.workers.moe_passes import MoEPasses
from hybridrl.workers.optim import (
    build_optimizer,
    build_scheduler,
    guarded_step,
    guarded_step_on_device,
    steps_on_device,
    summarize_steps,
)


def autocast_dtype(device: torch.device):
    """bf16 autocast over fp32 master weights on GPUs; plain fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


def _host_floats(values: list) -> list[float]:
    """Python numbers and 0-dim tensors (any devices) as floats, with one read per device."""
    out = [v if not isinstance(v, torch.Tensor) else None for v in values]
    by_device: dict = defaultdict(list)
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            by_device[v.device].append(i)
    for idx in by_device.values():
        for i, x in zip(idx, to_floats([values[i].float() for i in idx])):
            out[i] = x
    return [float(v) for v in out]


def to_floats(values: list[torch.Tensor]) -> list[float]:
    """0-dim tensors as Python floats with one device sync for all of them (exact: the stack
    promotes to the widest dtype). A `float()` per micro-batch metric would make the host wait
    for each forward pass before it could queue the backward."""
    return torch.stack([v.detach() for v in values]).tolist() if values else []


@contextmanager
def eval_mode(model):
    """`model` in eval mode inside (no dropout: log-probs and values must be deterministic),
    back in its previous mode after, also when the pass raises."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class Split:
    """How a (mini-)batch is cut into micro-batches: `micro_size` rows each, or with `dynamic`
    by a budget of `max_tokens` real tokens; `what` names the budget's config key in errors."""

    micro_size: int
    dynamic: bool = False
    max_tokens: int = 0
    what: str = ""
    share_prompts: bool = False  # budgets count a shared prompt once and keep its rows together


def dp_micro_batches(batch: Batch, split: Split) -> tuple[list[Batch], list[int]]:
    """`micro_batches`, with the same number of micro-batches on every data-parallel rank: FSDP
    gathers weights in every forward (and reduces gradients in every backward), so the ranks
    must run as many passes. Fixed splits agree already (every rank has as many rows); token
    budgets are raised to the largest count over the ranks, until all ranks agree (a split into
    more parts never fails: one row per part always fits)."""
    if split.dynamic and active().sp > 1:
        # The sp ranks of a group share each micro-batch, each running 1/sp of its tokens: a
        # budget of B tokens per device is B x sp per micro-batch (verl's meaning).
        split = replace(split, max_tokens=split.max_tokens * active().sp)
    micros, order = micro_batches(batch, **asdict(split))
    if not split.dynamic:
        return micros, order
    while True:
        most, fewest = dp_max_min(len(micros))
        if most == fewest:
            return micros, order
        if most > len(batch):
            raise RuntimeError(f"{split.what}: another rank needs {most} micro-batches but this one has {len(batch)} rows")
        micros, order = micro_batches(batch, **asdict(split), min_parts=most)


def token_shares(micros: list[Batch]) -> list[float]:
    """Each micro-batch's share of the real tokens of an optimizer step's micro-batches on this rank."""
    counts = [float(sequence_lengths(m).sum()) if K.RESPONSE_MASK in m else float(len(m)) for m in micros]
    total = sum(counts) or 1.0
    return [c / total for c in counts]


def mini_batch_norms(mini: Batch) -> dict[str, float]:
    """The loss normalizers of one optimizer step: response tokens and sequences of the whole
    mini-batch, passed to every micro-batch's loss so that the sum over micro-batches is the
    mini-batch loss whatever the split. Under data parallelism they are the counts of the
    mini-batch over all ranks / dp (`dp_normalizer`, an all-reduce): FSDP averages the ranks'
    gradients, and the average is then the single-device one for every loss_agg_mode.
    ("seq-mean-token-sum-norm" also divides by the response width R, which every micro-batch and
    every rank keeps since they are row subsets of the step's batch.)"""
    return {"global_tokens": dp_normalizer(float(mini[K.RESPONSE_MASK].sum())), "global_seqs": dp_normalizer(float(len(mini)))}


class Objective(Protocol):
    """What an update minimizes (`hybridrl.workers.objectives`): the engine calls `norms` once
    per optimizer step, the objective once per micro-batch (`forward` runs the engine's model
    on a micro-batch), and `summarize` once per optimizer step with the micro-batches' metrics."""

    def norms(self, mini: Batch) -> dict[str, float]: ...

    def __call__(self, forward: Callable, micro: Batch, norms: dict[str, float]) -> tuple[torch.Tensor, dict]: ...

    def summarize(self, micros: list[dict], norms: dict[str, float]) -> dict[str, list[float]]: ...


@dataclass
class _ExtraOptimizer:
    optimizer: torch.optim.Optimizer
    max_norm: float


class TrainEngine:
    """One model on this rank, its forward pass, its optimizer(s), its update loop.

    `forward(engine, model, micro, **kw)` is the role's pass (log-probs, values); it runs under
    the engine's autocast and packing and adds the token slots it computed to `slots` (for
    `pad_fraction`). A frozen engine (the reference) just never gets an optimizer.
    """

    def __init__(self, device: torch.device, role: str, forward: Callable):
        self.device, self.role, self.forward = device, role, forward
        self.amp = autocast_dtype(device)
        self.model = self.packing = self.optimizer = self.scheduler = None
        self.grad_clip, self.optimizer_offload = 0.0, False
        self.extra: dict[str, _ExtraOptimizer] = {}  # named optimizers beside the main one (the warm-up's)
        self.nonfinite_in_a_row = 0
        self.steps_taken = 0  # optimizer steps that changed the weights (any optimizer): weight sync reads it
        self.on_device = False  # guarded steps skip a non-finite gradient on the device (fused AdamW)
        self._unread = None  # the last on-device step's SkipFlag (workers/optim.py), not read yet
        self.slots = 0  # token slots computed (padding included) since the last reset: pad_fraction
        self.share_prompts = False  # packed passes compute a repeated prompt once (models/packing.py)
        self.shared = 0  # token positions not computed since the last reset, their prompt shared
        self.graphs = None  # the CUDA graphs of the packed passes (actor.use_cuda_graph), if on
        self.accumulation: dict[str, bool] = {}  # fsdp.accumulation's options for each optimizer step
        self.moe = MoEPasses(None)  # a mixture of experts' routing in the passes (replay, aux loss); set by place

    # -- setup -----------------------------------------------------------------------------------
    def place(
        self,
        model,
        *,
        remove_padding: bool,
        attn_backend: str = "auto",
        checkpointing: bool = False,
        compile_layers: bool = False,
        param_offload: bool = False,
        forward_methods: tuple[str, ...] = (),
        hooks_on=None,
        train: bool = True,
        share_prompts: bool = False,
        cuda_graph: bool = False,
        fsdp_config=None,
        expert_parallel: int = 1,
    ):
        """Take `model` (loaded on the host): hooks, compiled layers and FSDP2 (`parallelize`);
        in train mode, or frozen (eval mode, no gradients) with `train=False`. `share_prompts`:
        packed passes compute a prompt that several rows repeat once. `cuda_graph`: its packed passes
        replay CUDA graphs (`models/graphs.py`) where they can. `fsdp_config`: the role's
        FSDPConfig, whose reduce_grads_once / reshard_after_forward shape each update's
        micro-batch loop (`fsdp.accumulation`). `expert_parallel`: a mixture of experts' experts
        split over groups of that many ranks (distributed/expert_parallel.py)."""
        if fsdp_config is not None:
            self.accumulation = {
                "reduce_grads_once": fsdp_config.reduce_grads_once,
                "reshard_after_forward": fsdp_config.reshard_after_forward,
            }
        self.model, self.packing = parallelize(
            model,
            self.device,
            remove_padding=remove_padding,
            attn_backend=attn_backend,
            checkpointing=checkpointing,
            compile_layers=compile_layers,
            param_offload=param_offload,
            forward_methods=forward_methods,
            hooks_on=hooks_on,
            expert_parallel=expert_parallel,
        )
        self.share_prompts = share_prompts and self.packing is not None
        self.moe = MoEPasses(moe_block.state_of(self.model))
        if train:
            self.model.train()
        else:
            self.freeze()
        if cuda_graph:
            self.enable_graphs()
        return self.model

    def enable_graphs(self) -> None:
        """Replay the model's packed passes as CUDA graphs (`models/graphs.py`), or say why not."""
        hf = base_model(self.model)
        self.graphs = decoder_graphs.enable(self.model, hf.get_decoder(), self.device, self.packing)

    def freeze(self) -> None:
        self.model.eval()
        self.model.requires_grad_(False)

    def build_optimizer(self, optim_cfg, total_steps: int, grad_clip: float, offload_state: bool = False) -> None:
        """AdamW over the trainable parameters and its LR schedule (`workers/optim.py`); every
        `step` clips to `grad_clip` and skips non-finite gradients; `offload_state`
        (fsdp_config.optimizer_offload) keeps Adam's moments in CPU memory between steps."""
        self.optimizer = build_optimizer(self.model.parameters(), optim_cfg)
        self.scheduler = build_scheduler(self.optimizer, optim_cfg, total_steps)
        self.grad_clip, self.optimizer_offload = grad_clip, offload_state
        self.on_device = steps_on_device(self.optimizer, offload_state)

    def add_optimizer(self, name: str, build: Callable[[list], torch.optim.Optimizer], max_norm: float) -> None:
        """A second optimizer over the trainable parameters, built on first use by `build(params)`
        (the supervised warm-up's AdamW, so the main optimizer's state stays clean); its `step`
        clips to `max_norm` and always steps, with no schedule."""
        if name not in self.extra:
            self.extra[name] = _ExtraOptimizer(build([p for p in self.model.parameters() if p.requires_grad]), max_norm)

    # -- passes ----------------------------------------------------------------------------------
    def run(self, micro: Batch, model=None, **kw):
        """The role's forward of one micro-batch (already on the device) on `model` (default: this
        engine's; the LoRA reference is the same module with its adapters off)."""
        return self.forward(self, self.model if model is None else model, micro, **kw)

    @torch.no_grad()
    def infer(self, batch: Batch, split: Split, fn: Callable | None = None):
        """`fn(micro)` (default: the forward, `run`) of every micro-batch (moved to the device), on
        the host and concatenated in the batch's row order (token-budget micro-batches come
        reordered); a tuple of such tensors when `fn` returns tuples. The caller picks the
        train/eval mode."""
        micros, order = dp_micro_batches(batch, self._split(split))
        # One copy to the host at the end: a copy per micro-batch would make the host wait for
        # each pass before it could prepare the next one, and the device would idle meanwhile.
        outs = [(fn or self.run)(pack_on_host(self, micro, self.device)) for micro in micros]
        if outs and isinstance(outs[0], tuple):
            return tuple(restore_order(torch.cat(parts).cpu(), order) for parts in zip(*outs))
        return restore_order(torch.cat(outs).cpu(), order)

    def _split(self, split: Split) -> Split:
        """Token budgets that count a shared prompt once, when this engine's passes share them
        (and sequence parallelism, which does not, is off)."""
        return replace(split, share_prompts=True) if self.share_prompts and split.dynamic and active().sp == 1 else split

    # -- update ----------------------------------------------------------------------------------
    def update(
        self,
        batch: Batch,
        objective: Objective,
        split: Split,
        *,
        epochs: int = 1,
        shuffle: bool = False,
        mini_size: int | None = None,
        optimizer: str | None = None,
    ) -> dict[str, list[float]]:
        """`epochs` passes over `batch` (reshuffled each epoch with `shuffle`), one optimizer step
        per mini-batch of `mini_size` rows (default: the whole batch); the metrics of every step,
        with `<role>/grad_norm` and `<role>/nonfinite_skipped` (1.0 for a skipped step)."""
        # Nothing is read on the host inside the loop: each step's metrics stay on the device and
        # are summarized after it, and with `on_device` steps the gradient norm too, so the host
        # can queue the next mini-batch's passes while the device still runs this step's.
        steps = []
        for _ in range(epochs):
            rows = batch.index(torch.randperm(len(batch))) if shuffle else batch
            for mini in rows.split(mini_size or len(batch)):
                parts, norms = self._backward(mini, objective, split)
                steps.append((parts, norms, *self.step(optimizer)))
        self.read_steps()
        metrics: dict[str, list[float]] = defaultdict(list)
        for parts, norms, _, _ in steps:
            for k, v in objective.summarize(parts, norms).items():
                metrics[k].extend(v)
        norms_and_flags = _host_floats([x for *_, grad_norm, stepped in steps for x in (grad_norm, stepped)])
        for grad_norm, stepped in zip(norms_and_flags[0::2], norms_and_flags[1::2]):
            metrics[f"{self.role}/grad_norm"].append(grad_norm)
            metrics[f"{self.role}/nonfinite_skipped"].append(0.0 if stepped else 1.0)
        return metrics

    def backward(self, mini: Batch, objective: Objective, split: Split) -> dict[str, list[float]]:
        """Accumulate one optimizer step's gradient, micro-batch by micro-batch; its metrics.
        Each micro-batch's loss is its share of the mini-batch loss (`objective.norms` are the
        whole mini-batch's counts), so the gradient does not depend on the split."""
        return objective.summarize(*self._backward(mini, objective, split))

    def _backward(self, mini: Batch, objective: Objective, split: Split) -> tuple[list[dict], dict]:
        """`backward` with its micro-batches' metrics still on the device, and the norms."""
        norms = objective.norms(mini)
        micros, _ = dp_micro_batches(mini, self._split(split))
        parts, shares = [], token_shares(micros) if self.moe.active else [1.0] * len(micros)
        with accumulation(self.model, len(micros), **self.accumulation) as before:
            for i, micro in enumerate(micros):
                before(i)
                self.moe.aux_share = shares[i]  # the micro-batch's weight in the MoE load-balancing loss
                loss, m = objective(self.run, pack_on_host(self, micro, self.device), norms)
                loss.backward()
                parts.append(m)
        return parts, norms

    def step(self, optimizer: str | None = None) -> tuple[float | torch.Tensor, bool | torch.Tensor]:
        """The main optimizer's guarded step (`guarded_step`: clip, skip a non-finite gradient,
        schedule), or named optimizer `optimizer`'s plain clipped step; (grad_norm, stepped).
        With `on_device` steps both are 0-dim device tensors, and the schedule, `steps_taken`
        and `nonfinite_in_a_row` catch up when the step's flag is read (`read_steps`: by the next
        step, and at the end of `update`)."""
        if self.graphs is not None:
            self.graphs.settle()  # every backward of this step has run
        average_gradients(self.model)  # replicated (fsdp_size=1): one all-reduce per step; else no-op
        reduce_expert_gradients(self.model)  # expert-parallel experts: one device's gradient; else no-op
        if optimizer is not None:
            extra = self.extra[optimizer]
            grad_norm, stepped = clip_grad_norm(list(self.model.parameters()), extra.max_norm), True
            extra.optimizer.step()
            extra.optimizer.zero_grad(set_to_none=True)
        elif self.on_device:
            self.read_steps()  # the previous step's flag: the LR of this step depends on it
            grad_norm, flag = guarded_step_on_device(self.model, self.optimizer, self.grad_clip)
            self._unread = flag
            return grad_norm, 1.0 - flag.tensor
        else:
            grad_norm, stepped = guarded_step(self.model, self.optimizer, self.scheduler, self.grad_clip, self.optimizer_offload)
            self.nonfinite_in_a_row = 0 if stepped else self.nonfinite_in_a_row + 1
        self.steps_taken += stepped
        return grad_norm, stepped

    def read_steps(self) -> None:
        """Read the last on-device step's `skipped` flag and catch up with it: a step taken
        advances the LR schedule and `steps_taken`, a skipped one counts in `nonfinite_in_a_row`
        (what `guarded_step` does at once on the host path)."""
        if self._unread is None:
            return
        skipped, self._unread = self._unread.read(), None
        if skipped:
            self.nonfinite_in_a_row += 1
        else:
            self.scheduler.step()
            self.nonfinite_in_a_row = 0
            self.steps_taken += 1

    def summarize(self, metrics: dict[str, list[float]]) -> dict[str, float]:
        """An update's metrics (`update`'s lists) averaged over its steps (`summarize_steps`)."""
        self.read_steps()
        return summarize_steps(metrics, self.role, self.nonfinite_in_a_row, self.scheduler)

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, path: str | Path, tokenizer=None, weights: bool = True) -> None:
        """Sharded (DCP) weights (unless `weights=False`: the caller wrote them), optimizer and
        scheduler under `path`; every rank writes its shards."""
        if weights:
            dckpt.save_model(self.model, path, self.model.config, tokenizer)
        if self.optimizer is not None:
            self.read_steps()  # the schedule caught up with the last on-device step
            dckpt.save_optimizer(self.model, self.optimizer, self.scheduler, path)

    def load(self, path: str | Path, weights: bool = True) -> None:
        """What `save` wrote, saved at any world size."""
        if weights:
            dckpt.load_model(self.model, path)
        if self.optimizer is not None:
            dckpt.load_optimizer(self.model, self.optimizer, self.scheduler, path)


# An update's perf metrics, read from the engine's counters (`slots`, `shared`: the forward passes add to them).
def perf_start(engine: TrainEngine) -> float:
    """Start timing an update of `engine` (and counting its token slots)."""
    engine.slots = engine.shared = 0
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
        torch.cuda.reset_peak_memory_stats(engine.device)
    return time.perf_counter()


def perf_metrics(engine: TrainEngine, batch: Batch, start: float, epochs: int, passes: float) -> dict[str, float]:
    """perf/mfu/<role> (useful model FLOPs of `passes` forwards per row per epoch,
    tracking/perf.py), peak memory, <role>/pad_fraction (padding among the computed slots),
    <role>/shared_prompt_fraction (token positions of repeated prompts computed once)."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    seconds = time.perf_counter() - start
    lengths = sequence_lengths(batch)  # (B,) real tokens; every epoch passes every row once
    shared = engine.shared // max(epochs, 1)  # per pass over the batch
    out = perf.update_metrics(
        engine.model,
        lengths,
        int(batch[K.RESPONSE_MASK].sum()),
        passes * epochs,
        seconds,
        engine.device,
        role=engine.role,
        shared_tokens=shared,
    )
    out[f"{engine.role}/pad_fraction"] = 1.0 - epochs * float(lengths.sum()) / max(engine.slots, 1)
    if engine.share_prompts:
        out[f"{engine.role}/shared_prompt_fraction"] = engine.shared / max(engine.slots, 1)
    return out
