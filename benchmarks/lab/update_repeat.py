"""One actor update timed 5 times after 2 warm-up updates (median), then profiled once: kernel count
and device time. `benchmarks/update.py` times a single update per path; this repeats it, to tell a
change from run-to-run noise when comparing two trees in one call.

Command (one GPU), in each tree's root:  python benchmarks/lab/update_repeat.py OUT.json [0.5b|1.5b|tiny]
(the tree's own `hybridrl` and `benchmarks/update.py` are imported: run it from the tree's root).
"""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")

import torch  # noqa: E402
import update as U  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from hybridrl.models.prepare import compile_decoder_layers  # noqa: E402
from hybridrl.models.tiny import write_tiny_model_dir  # noqa: E402

SIZES = dict(seqs=256, prompt=(100, 300), response=(20, 1024), mini=64, budget=16384)


def main(out: str, arch: str = "0.5b") -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **U.ARCH[arch]))
    w = U.make_worker(model_dir, SIZES, dev)
    if dev.type == "cuda":
        compile_decoder_layers(w.model)
    rows = 256 if arch != "tiny" else 16
    batch = U.ragged_batch(rows, SIZES["prompt"], SIZES["response"], U.ARCH[arch]["vocab_size"])

    def update():
        w.update_actor(batch.select(batch.keys()))
        U.sync(dev)

    for _ in range(2):
        update()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        update()
        times.append(time.perf_counter() - t0)
    times.sort()
    print("update s:", [round(t, 3) for t in times], "median", round(times[2], 3))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        update()
    events = prof.key_averages()
    cuda = sorted(((e.key, e.count, e.device_time_total) for e in events if e.device_time_total > 0), key=lambda x: -x[2])
    print("cuda kernels total count", sum(c for _, c, _ in cuda), "device us", round(sum(t for *_, t in cuda)))
    cpu = sorted(((e.key, e.count, e.cpu_time_total) for e in events), key=lambda x: -x[2])[:25]
    counts = {e.key: e.count for e in events}
    Path(out).write_text(json.dumps({"times": times, "cuda": cuda[:40], "cpu": cpu, "counts": counts}))


if __name__ == "__main__":
    main(*sys.argv[1:])
