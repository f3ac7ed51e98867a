"""Where GRPO's passes spend their time: the GPU-busy share and the top kernels of the update, the
old log-prob pass and the reference pass, on the GSM8K step's shapes (benchmarks/shared_prompts.py's
batch and worker: 32 prompts x 16 samples, random weights of a Qwen2.5 architecture).

Command (one GPU):  PYTHONPATH=. python benchmarks/profile_passes.py --models 0.5b --out $OUT
CPU smoke test:     PYTHONPATH=. python benchmarks/profile_passes.py --tiny

Each pass: one warm-up, --repeats timed runs (median seconds), then one run under torch.profiler:
busy = the union of the kernels' intervals over the run's wall time; kernels grouped (GEMMs,
attention, the fused log-prob, optimizer, elementwise/other) and the top 12 by device time.
With --compare-packing, each pass is also timed with the packed layout computed on the device
(the code before `pack_on_host`: a baseline in the same run), alternately with the default, and
the two ways' old log-probs compared. With --count-syncs, the calls in each pass that make the
host wait for the device (`torch.cuda.set_sync_debug_mode`), by call site. With --budgets, the update is also timed at each token
budget per micro-batch; with --concurrent,
the old log-prob and reference passes one after the other against the two at once (two threads,
each on its own CUDA stream). With --steps-ab, the update with its guarded optimizer steps on the
device (the fused AdamW's default) and on the host (each step's gradient norm read), alternately.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from shared_prompts import batch_arguments, grpo_batch, make_worker, parse, save_rows  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from update import ARCH, sync, timed  # noqa: E402

from hybridrl.data import keys as K
from hybridrl.models.tiny import write_tiny_model_dir

GROUPS = (  # first match wins; lower-case substrings of kernel names
    # attention first: flash-attention's kernel names carry cutlass template arguments
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("gemm", ("nvjet", "gemm", "cutlass", "cublas", "sm90_xmma", "splitk")),
    # the LM head's softmax algebra: forward statistics and backward d logits (Inductor's or
    # hybridrl.models.logprob_kernels')
    ("log-prob algebra", ("logsumexp", "log_prob", "_stats_partial", "_stats_combine", "_grad_kernel", "arange_eq_exp")),
    ("compiled elementwise (Triton)", ("triton_",)),
    ("optimizer", ("adam", "multi_tensor", "foreach", "norm_kernel", "clip")),
    ("copy", ("memcpy", "memset", "copy")),
)


def _group(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "elementwise/other"


def _busy(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s >= end:
            total, end = total + (e - s), e
        elif e > end:
            total, end = total + (e - end), e
    return total


def profile(fn, device: torch.device) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        _, wall, _ = timed(fn, device)
    # kernels only: a record_function range (e.g. "Optimizer.step#AdamW.step") also appears on the
    # GPU timeline as a user annotation, which would count its whole span as busy kernel time
    kernels = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]
    if device.type == "cuda":
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=15), flush=True)
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    by_name: dict[str, float] = {}
    by_group: dict[str, float] = {}
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        by_name[e.name] = by_name.get(e.name, 0.0) + us
        by_group[_group(e.name)] = by_group.get(_group(e.name), 0.0) + us
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "wall_s": wall,
        "kernel_s": sum(by_name.values()) / 1e6,
        "busy": _busy(intervals) / 1e6 / wall if wall > 0 else 0.0,
        "kernels": len(kernels),
        "groups_s": {g: us / 1e6 for g, us in sorted(by_group.items(), key=lambda kv: -kv[1])},
        "top_s": [(name[:160], us / 1e6) for name, us in top],
    }


def host_profile(fn, device: torch.device, top: int = 30) -> dict:
    """One run under cProfile: the host's seconds by function (own time), the biggest first. Time
    the host spends waiting for the device shows up in the call that waits (a read, a sync)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    sync(device)
    t0 = time.perf_counter()
    prof.enable()
    fn()
    sync(device)
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof).stats
    rows = [(f"{Path(f).name}:{line}({func})", calls, own, cum) for (f, line, func), (_, calls, own, cum, _) in stats.items()]
    rows.sort(key=lambda r: -r[2])
    return {"wall_s": wall, "own_s_total": sum(r[2] for r in rows), "top": rows[:top]}


def bench(name: str, a: argparse.Namespace, device: torch.device) -> dict:
    model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **ARCH[name]))
    batch = grpo_batch(a.prompts, a.n, a.prompt_range, a.response_range, ARCH[name]["vocab_size"])
    w = make_worker(model_dir, a, device)
    passes = {
        "update_actor": lambda: w.update_actor(batch.select(list(batch.tensors))),
        "old_log_prob": lambda: w.compute_log_prob(batch.select(list(batch.tensors))),
        "ref": lambda: w.compute_ref_log_prob(batch.select(list(batch.tensors))),
    }
    row = {"model": name, "passes": {}, "update_by_budget": {}}
    for pass_name, fn in passes.items():
        fn()  # warm-up: compilation
        seconds = [timed(fn, device)[1] for _ in range(a.repeats)]
        row["passes"][pass_name] = {"median_s": statistics.median(seconds), "all_s": seconds, "profile": profile(fn, device)}
        p = row["passes"][pass_name]["profile"]
        print(
            f"{name} {pass_name}: {statistics.median(seconds):.3f} s; profiled {p['wall_s']:.3f} s, "
            f"busy {p['busy']:.0%}, {p['kernels']} kernels",
            flush=True,
        )
        for g, s in p["groups_s"].items():
            print(f"    {g:18s} {s:.3f} s")
        for k, s in p["top_s"]:
            print(f"      {s:.3f} s  {k}")
    if device.type == "cuda":  # CUDA graphs keep their memory pools: reserved, not only allocated, memory counts
        row["max_reserved_gb"] = torch.cuda.max_memory_reserved(device) / 2**30
        print(f"{name}: most memory reserved {row['max_reserved_gb']:.1f} GB", flush=True)
    for role, engine in (("actor", w.engine), ("ref", w.reference.engine)):
        g = engine.graphs
        if g is not None:
            row[f"{role}_graphs"] = dict(captures=g.captures, replays=g.replays, eager=g.eager, off=g.off)
            print(f"{name} {role} graphs: {row[f'{role}_graphs']}", flush=True)
    if a.host_profile:
        row["host"] = {pass_name: host_profile(fn, device) for pass_name, fn in passes.items()}
        for pass_name, h in row["host"].items():
            print(f"{pass_name} on the host (cProfile, {h['wall_s']:.3f} s):", flush=True)
            for where, calls, own, cum in h["top"][:20]:
                print(f"    {own:7.4f} s own {cum:7.4f} s cum {calls:7d} calls  {where}")
    if a.count_syncs:
        row["syncs"] = {pass_name: count_syncs(fn, device) for pass_name, fn in passes.items()}
        for pass_name, c in row["syncs"].items():
            print(f"{pass_name}: {c['total']} waits for the device", flush=True)
            for site, n in list(c["sites"].items())[:8]:
                print(f"    {n:4d}  {site}")
    if a.compare_packing:
        row["packing_on_host_vs_device"] = compare_packing(w, passes, a.repeats, device)
    if a.concurrent and device.type == "cuda":
        row["old_and_ref"] = old_and_ref(passes["old_log_prob"], passes["ref"], a.repeats, device)
    if a.steps_ab and w.engine.on_device:
        row["update_steps_on_device_vs_host"] = steps_ab(w.engine, passes["update_actor"], a.repeats, device)
    for budget in a.budgets:
        w.arr.actor.ppo_max_token_len_per_gpu = budget
        passes["update_actor"]()
        seconds = [timed(passes["update_actor"], device)[1] for _ in range(a.repeats)]
        row["update_by_budget"][budget] = statistics.median(seconds)
        print(f"{name} update_actor at a {budget}-token budget: {statistics.median(seconds):.3f} s", flush=True)
    return row


def steps_ab(engine, update, repeats: int, device: torch.device) -> dict:
    """The update with its guarded steps on the device (the default with the fused AdamW) and on
    the host (reading each step's gradient norm, the code before), alternately in this process."""
    seconds = {True: [], False: []}
    for _ in range(repeats):
        for on_device in (True, False):
            engine.on_device = on_device
            seconds[on_device].append(timed(update, device)[1])
    engine.on_device = True
    out = {"on_device_s": statistics.median(seconds[True]), "on_host_s": statistics.median(seconds[False]), "all": seconds}
    print(f"update, steps on the device {out['on_device_s']:.3f} s, on the host {out['on_host_s']:.3f} s", flush=True)
    return out


def count_syncs(fn, device: torch.device) -> dict:
    """The calls in `fn` that make the host wait for the device, counted by hybridrl call site."""
    import collections
    import traceback
    import warnings

    sites: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/hybridrl/" in f.filename]
        sites[" <- ".join(f"{f.filename.split('/hybridrl/')[-1]}:{f.lineno}" for f in frames[-1:-4:-1])] += 1

    if device.type != "cuda":
        return {"total": 0, "sites": {}}
    shown = warnings.showwarning
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        warnings.showwarning = shown
    sites.pop("", None)  # the mode's own "prototype feature" notice
    return {"total": sum(sites.values()), "sites": dict(sites.most_common())}


def compare_packing(w, passes: dict, repeats: int, device: torch.device) -> dict:
    """Each pass with the layout packed on the host (the default) and on the device (the
    baseline: each micro-batch copied as it is and packed by the forward), alternately; medians;
    and the largest difference between the two ways' old log-probs."""
    from hybridrl.workers import engine as engine_module

    on_host = engine_module.pack_on_host

    def on_device(engine, micro, dev):
        return micro.to(dev)

    out = {}
    logp = {}
    for way, fn in (("host", on_host), ("device", on_device)):
        engine_module.pack_on_host = fn
        logp[way] = passes["old_log_prob"]()[K.OLD_LOG_PROBS]
    for pass_name, run in passes.items():
        times = {"host": [], "device": []}
        for _ in range(repeats):
            for way, fn in (("host", on_host), ("device", on_device)):
                engine_module.pack_on_host = fn
                times[way].append(timed(run, device)[1])
        engine_module.pack_on_host = on_host
        out[pass_name] = {way: statistics.median(t) for way, t in times.items()}
        med = out[pass_name]
        print(f"{pass_name}: packed on the host {med['host']:.3f} s, on the device {med['device']:.3f} s", flush=True)
    out["max_abs_log_prob_diff"] = float((logp["host"] - logp["device"]).abs().max())
    print(f"old log-probs, host vs device packing: max difference {out['max_abs_log_prob_diff']:.3g}", flush=True)
    return out


def old_and_ref(old, ref, repeats: int, device: torch.device) -> dict:
    """Seconds for both log-prob passes: in turn, and at once on two streams (medians)."""
    streams = [torch.cuda.Stream(device), torch.cuda.Stream(device)]

    def on(stream, fn, errors):
        try:
            with torch.cuda.stream(stream):
                fn()
            stream.synchronize()
        except BaseException as e:  # noqa: BLE001  reported, not raised: an experiment
            errors.append(repr(e))

    def at_once():
        errors: list[str] = []
        t = threading.Thread(target=on, args=(streams[1], ref, errors))
        t.start()
        on(streams[0], old, errors)
        t.join()
        if errors:
            raise RuntimeError(errors[0])

    out = {}
    for name, fn in (("in_turn", lambda: (old(), ref())), ("at_once", at_once)):
        try:
            fn()
            out[name] = statistics.median(timed(fn, device)[1] for _ in range(repeats))
        except RuntimeError as e:
            out[name] = f"failed: {e}"
        print(f"old log-prob + ref {name}: {out[name]}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    batch_arguments(p, models="0.5b", update_budget=16384)
    p.add_argument("--budgets", type=int, nargs="*", default=[], help="also time the update at these budgets")
    p.add_argument("--count-syncs", action="store_true", help="count the calls that wait for the device (CUDA)")
    p.add_argument("--compare-packing", action="store_true", help="also each pass with the layout packed on the device")
    p.add_argument("--host-profile", action="store_true", help="also each pass under cProfile (the host's time by function)")
    p.add_argument("--concurrent", action="store_true", help="also the two log-prob passes at once (CUDA)")
    p.add_argument(
        "--steps-ab", action="store_true", help="also the update with guarded steps on the device and on the host, alternately"
    )
    a, device = parse(p)
    if a.tiny:
        a.budgets = a.budgets or [128]
    rows = [bench(name, a, device) for name in a.models.split(",")]
    save_rows(a, device, rows, "profile_passes.json")


if __name__ == "__main__":
    main()
