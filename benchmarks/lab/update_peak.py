"""The GSM8K-shaped update's time and peak GPU memory (random weights of a Qwen2.5 architecture,
benchmarks/shared_prompts.py's batch and worker: 32 prompts x 16 samples, budget 24,576 tokens).

Command (one GPU):  PYTHONPATH=. python benchmarks/lab/update_peak.py NAME [--models 0.5b]
CPU smoke test:     PYTHONPATH=. python benchmarks/lab/update_peak.py NAME --tiny

One warm-up update, then --repeats timed ones: prints NAME, the median seconds and the largest peak.
`--keep-logits-gb 0` makes the LM head's backward recompute the logits (the code before 2026-11-27's
kept logits; docs/performance.md), for an A/B in one call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: shared_prompts, update
from shared_prompts import batch_arguments, grpo_batch, make_worker, parse  # noqa: E402
from update import ARCH, timed  # noqa: E402

from hybridrl.models import logprobs
from hybridrl.models.tiny import write_tiny_model_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a label for the printed line (e.g. before / now)")
    batch_arguments(p, models="0.5b", update_budget=24576)
    p.add_argument(
        "--keep-logits-gb",
        type=float,
        default=None,
        help="logprobs.KEEP_LOGITS_BYTES in GiB (0: the LM head's backward recomputes the logits; default: the library's)",
    )
    a, device = parse(p)
    if a.keep_logits_gb is not None:
        logprobs.KEEP_LOGITS_BYTES = int(a.keep_logits_gb * 2**30)
    name = a.models.split(",")[0]
    model_dir = str(write_tiny_model_dir(tempfile.mkdtemp(), **ARCH[name]))
    batch = grpo_batch(a.prompts, a.n, a.prompt_range, a.response_range, ARCH[name]["vocab_size"])
    w = make_worker(model_dir, a, device)

    def update():
        return w.update_actor(batch.select(list(batch.tensors)))

    update()
    runs = [timed(update, device) for _ in range(a.repeats)]
    peak = max(r[2] or 0.0 for r in runs)
    print(f"{a.name} update s {statistics.median(r[1] for r in runs):.3f} peak GB {peak:.2f}", flush=True)


if __name__ == "__main__":
    main()
