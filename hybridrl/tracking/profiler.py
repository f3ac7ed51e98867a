"""`trainer.profile_steps`: torch.profiler around chosen steps, in every worker process.

One profiler per process (colocated roles share a process, so they share its trace); each
writes `<role>_rank<R>.json` (a Chrome / Perfetto trace) and `<role>_rank<R>.txt` (the ops with
the most device time, or CPU time on a CPU run) into the step's directory.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

_active: tuple | None = None  # (profiler, out_dir, device, role) of this process


def start(out_dir: str | Path, device: torch.device, role: str) -> bool:
    """Start profiling this process; False when it is already being profiled (another role)."""
    global _active
    if _active is not None:
        return False
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the trace starts with the device idle
    prof = profile(activities=activities)
    prof.start()
    _active = (prof, Path(out_dir), device, role)
    return True


def stop(row_limit: int = 40) -> str | None:
    """Stop, write the trace and the table; the table's path, or None if this process was not profiled."""
    global _active
    if _active is None:
        return None
    prof, out_dir, device, role = _active
    _active = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # work still queued belongs to the profiled step
    prof.stop()
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{role}_rank{rank}"
    prof.export_chrome_trace(f"{stem}.json")
    sort = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    Path(f"{stem}.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=row_limit) + "\n")
    return f"{stem}.txt"
