"""What the head-to-head benchmarks (dpo.py, vs_trl.py) share: one trainer per child process, so
each one's peak memory is its own, and the versions line printed beside the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def versions() -> dict:
    import torch
    import transformers

    v = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
    return v


def leave_process_group() -> None:
    """End a torchrun benchmark: leave together, then skip interpreter teardown. Under load, a gloo
    rank that tears down while its peer is still finishing (or whose gloo threads outlive the
    interpreter) aborts with "terminate called without an active exception" (1 run in 12 of
    `reshard.py --smoke` on 2 busy cores; 0 in 48 with this)."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def child_env() -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_child(tag: str, name: str, cmd: list[str], out: Path, work: Path) -> dict:
    """Run `cmd` (which writes work/<name>.json), log to out/<name>.log; its result plus wall time,
    or {"error": ...} with the log's tail printed."""
    print(f"[{tag}] running {name} ...", flush=True)
    t0 = time.perf_counter()
    with (out / f"{name}.log").open("w") as log:
        rc = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        tail = (out / f"{name}.log").read_text().splitlines()[-40:]
        print(f"[{tag}] {name} failed (rc={rc}); last lines of {out / (name + '.log')}:\n" + "\n".join(tail))
        return {"error": f"rc={rc}", "wall_s": wall}
    return {**json.loads((work / f"{name}.json").read_text()), "wall_s": wall}


def cell(value, fmt: str) -> str:
    """`value` formatted for a table column, or a dash of the same width when it is missing."""
    return format("-", f">{fmt.split('.')[0]}") if value is None else format(value, fmt)
