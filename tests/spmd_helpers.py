"""What the spawned gloo test workers share."""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def leave() -> None:
    """Leave together, then skip interpreter teardown: a rank that tears gloo down while a peer is
    still writing its result, or gloo threads outliving the interpreter, can abort a rank with
    "terminate called without an active exception" (seen in CI, test_reshard).
    benchmarks/harness.py's leave_process_group does the same for the torchrun benchmarks."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
