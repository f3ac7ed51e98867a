"""What a remote scorer's requests cost the trainer's interpreter: threads in the trainer against
the helper process (`custom_reward_function.remote.in_process`).

A stand-in for the decode loop counts how many short pure-Python iterations the main thread gets
through while a batch of responses is scored (each request answered after `--delay-s` by
`benchmarks/slow_service.py` on this machine), against the same loop with nothing else running.
Also the batch alone: its wall time and the trainer process's CPU seconds (all its threads; the
helper's own CPU is not the trainer's). Each way is timed `--repeats` times after a warm-up batch; medians.

    PYTHONPATH=. python benchmarks/remote_overhead.py --responses 512 --delay-s 0.025 --out OUT
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from hybridrl.rewards.remote import RemoteReward


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _spin(stop: threading.Event) -> int:
    """The main thread's stand-in for the decode loop: iterations of a little Python."""
    n, x = 0, 0
    while not stop.is_set():
        for i in range(100):
            x = (x + i * 7) % 1013
        n += 1
    return n


def _measure(remote: RemoteReward | None, responses: int, spin: bool = True) -> dict:
    sources, texts, truths = ["openai/gsm8k"] * responses, ["#### 7"] * responses, ["7"] * responses
    stop, result = threading.Event(), {}

    def score():
        t0, c0 = time.perf_counter(), _cpu_s()
        if remote is not None:
            out = remote.score_batch(sources, texts, truths, None)
            result["errors"] = out.num_errors
        else:
            time.sleep(0.5)
        result["wall_s"], result["cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
        stop.set()

    worker = threading.Thread(target=score)
    t0 = time.perf_counter()
    worker.start()
    spins = _spin(stop) if spin else 0
    worker.join()
    result["spins_per_s"] = spins / (time.perf_counter() - t0)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--responses", type=int, default=512)
    ap.add_argument("--delay-s", type=float, default=0.025)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--port", type=int, default=8019)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    service_py = str(Path(__file__).with_name("slow_service.py"))
    service = subprocess.Popen([sys.executable, service_py, "--port", str(args.port), "--delay-s", str(args.delay_s)])
    time.sleep(2.0)
    url = f"http://127.0.0.1:{args.port}/score"
    try:
        rows = {}
        idle = [_measure(None, 0)["spins_per_s"] for _ in range(args.repeats)]
        for name, process in (("threads in the trainer", False), ("helper process", True)):
            remote = RemoteReward(url, max_concurrency=args.concurrency, process=process)
            _measure(remote, args.responses)  # warm-up (starts the helper)
            runs = [_measure(remote, args.responses) for _ in range(args.repeats)]
            alone = [_measure(remote, args.responses, spin=False) for _ in range(args.repeats)]
            remote.close()
            assert all(r["errors"] == 0 for r in runs + alone), runs + alone
            rows[name] = {
                "wall_s_alone": statistics.median(r["wall_s"] for r in alone),
                "trainer_cpu_s": statistics.median(r["cpu_s"] for r in alone),
                "wall_s": statistics.median(r["wall_s"] for r in runs),
                "loop_share": statistics.median(r["spins_per_s"] for r in runs) / statistics.median(idle),
            }
    finally:
        service.kill()
    print(f"{args.responses} responses, {args.delay_s * 1000:g} ms per answer, {args.concurrency} in flight", end="")
    print(f"; medians of {args.repeats}")
    print("| requests made by | batch s | trainer CPU s | batch s beside a busy loop | the loop's speed vs idle |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['wall_s_alone']:.3f} | {r['trainer_cpu_s']:.3f} | {r['wall_s']:.3f} | {r['loop_share']:.0%} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "remote_overhead.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
