"""One actor update timed 5 times after 2 warm-up updates (median), then profiled once: kernel count
and device time. `benchmarks/update.py` times a single update per path; this repeats it, to tell a
change from run-to-run noise when comparing two trees in one call.

Command (one GPU), in each tree's root:  python benchmarks/update_repeat.py OUT.json [0.5b|1.5b|tiny]
(the tree's own `hybridrl` and `benchmarks/update.py` are imported: run it from the tree's root)."""

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import torch
import update as U

from hybridrl.models.prepare import compile_decoder_layers
from hybridrl.models.tiny import write_tiny_model_dir

dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ARCH = sys.argv[2] if len(sys.argv) > 2 else "0.5b"
s = dict(seqs=256, prompt=(100, 300), response=(20, 1024), mini=64, budget=16384)
tmp = tempfile.mkdtemp()
model_dir = str(write_tiny_model_dir(tmp, **U.ARCH[ARCH]))
w = U.make_worker(model_dir, s, dev)
if dev.type == "cuda":
    compile_decoder_layers(w.model)
batch = U.ragged_batch(256 if ARCH != "tiny" else 16, s["prompt"], s["response"], U.ARCH[ARCH]["vocab_size"])


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def upd():
    return w.update_actor(batch.select(batch.keys()))


for _ in range(2):
    upd()
times = []
for _ in range(5):
    sync()
    t0 = time.perf_counter()
    upd()
    sync()
    times.append(time.perf_counter() - t0)
times.sort()
print("update s:", [round(t, 3) for t in times], "median", round(times[2], 3))
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    upd()
    sync()
ev = prof.key_averages()
cuda = sorted(((e.key, e.count, e.device_time_total) for e in ev if e.device_time_total > 0), key=lambda x: -x[2])
print("cuda kernels total count", sum(c for _, c, _ in cuda), "device us", round(sum(t for *_, t in cuda)))
cpu = sorted(((e.key, e.count, e.cpu_time_total) for e in ev), key=lambda x: -x[2])[:25]
out = {"times": times, "cuda": cuda[:40], "cpu": cpu, "counts": {e.key: e.count for e in ev}}
Path(sys.argv[1]).write_text(json.dumps(out))
