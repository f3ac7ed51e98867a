"""Optimizer, LR schedule and the guarded optimizer step shared by the trainable roles."""

from __future__ import annotations

import math

import torch

from hybridrl.distributed.fsdp import clip_grad_norm, clip_grad_norm_on_device, move_optimizer_state


def build_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters. On CUDA (FSDP2's DTensor shards included) the fused
    implementation: one kernel per step that reads the parameter, gradient and moments once,
    where the default multi-tensor one makes a pass per elementwise op (BENCHMARKS.md: 30 against
    13 ms of kernels per step for a 0.5B model on an H100). Elsewhere torch's default: on CPU
    the stored metrics of the golden-run tests were made with it."""
    params = [p for p in params if p.requires_grad]
    fused = bool(params) and all(p.device.type == "cuda" and p.is_floating_point() for p in params)
    return torch.optim.AdamW(
        params,
        lr=optim_cfg.lr,
        betas=tuple(optim_cfg.betas),
        weight_decay=optim_cfg.weight_decay,
        fused=fused or None,
    )


def warmup_steps(optim_cfg, total_steps: int) -> int:
    if optim_cfg.lr_warmup_steps >= 0:
        return optim_cfg.lr_warmup_steps
    return int(optim_cfg.lr_warmup_steps_ratio * total_steps)


def build_scheduler(optimizer, optim_cfg, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to `lr`, then constant or cosine decay to `lr * min_lr_ratio`."""
    warm = warmup_steps(optim_cfg, total_steps)
    kind, floor = optim_cfg.lr_scheduler_type, optim_cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if kind == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def guarded_step(module, optimizer, scheduler, grad_clip: float, offload_state: bool = False) -> tuple[float, bool]:
    """Clip, then step only if the gradient norm is finite; returns (grad_norm, stepped).

    A NaN/inf gradient would poison the weights and Adam's moments for good, so the update
    is dropped instead (the caller counts these and stops after too many in a row).
    `offload_state` (fsdp_config.optimizer_offload) keeps Adam's moments in CPU memory
    between steps: they come to the parameters' device for the step only.
    """
    max_norm = grad_clip if grad_clip and grad_clip > 0 else float("inf")
    norm = clip_grad_norm(list(module.parameters()), max_norm)  # global over FSDP shards: same on every rank
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return norm, False
    if offload_state:
        move_optimizer_state(optimizer, next(module.parameters()).device)
    optimizer.step()
    if offload_state:
        move_optimizer_state(optimizer, "cpu")
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, True


def steps_on_device(optimizer, offload_state: bool = False) -> bool:
    """Whether `guarded_step_on_device` can take this optimizer's steps: torch's fused AdamW reads
    a `found_inf` flag (as GradScaler sets it) and leaves the weights, the moments and the step
    count alone when it is set. Moments offloaded to the CPU between steps take the host path."""
    return bool(optimizer.defaults.get("fused")) and getattr(optimizer, "_step_supports_amp_scaling", False) and not offload_state


class SkipFlag:
    """A guarded step's `skipped` flag on its way to the host: copied into pinned memory right
    after it is computed, with an event behind the copy, so that `read` waits for that point of
    the stream only, not for the work queued after it (a `.item()` would wait for all of it)."""

    def __init__(self, skipped: torch.Tensor):
        self.tensor = skipped  # on the device, for the fused kernel and the metrics
        self.host = skipped.to("cpu", non_blocking=True)
        self.event = None
        if skipped.is_cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def read(self) -> bool:
        if self.event is not None:
            self.event.synchronize()
        return bool(self.host.item())


def guarded_step_on_device(module, optimizer, grad_clip: float) -> tuple[torch.Tensor, SkipFlag]:
    """`guarded_step` without the host reading the gradient norm: clip, then step, with the fused
    kernel skipping the step on the device when the norm is not finite. Returns the norm (a 0-dim
    device tensor) and the step's SkipFlag. The LR schedule is left to the caller, to step once
    it has read the flag (TrainEngine reads it at the next step, when the device is past it)."""
    max_norm = grad_clip if grad_clip and grad_clip > 0 else float("inf")
    norm = clip_grad_norm_on_device(list(module.parameters()), max_norm)
    skipped = (~torch.isfinite(norm)).to(torch.float32)
    flag = SkipFlag(skipped)
    optimizer.grad_scale, optimizer.found_inf = None, skipped
    try:
        optimizer.step()
    finally:
        optimizer.found_inf = None
    optimizer.zero_grad(set_to_none=True)
    return norm, flag


def summarize_steps(metrics: dict[str, list[float]], role: str, nonfinite_in_a_row: int, scheduler) -> dict[str, float]:
    """An update's metrics from its optimizer steps' lists: means, except `<role>/nonfinite_skipped`
    (a count); the current run of skipped steps and the learning rate after the update."""
    out = {k: sum(v) / len(v) for k, v in metrics.items()}
    out[f"{role}/nonfinite_skipped"] = sum(metrics[f"{role}/nonfinite_skipped"])
    out[f"{role}/nonfinite_in_a_row"] = nonfinite_in_a_row
    out[f"{role}/lr"] = scheduler.get_last_lr()[0]
    return out
