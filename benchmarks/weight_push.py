"""Weight push to a separate rollout pool (resource_pool.rollout), within one node.

GPU command (4 GPUs: an FSDP2 trainer on 2, rollout ranks on the other 2, as in
`resource_pool.actor_rollout_ref=2 resource_pool.rollout=2`):
    PYTHONPATH=. python benchmarks/weight_push.py --trainer-ranks 2 --rollout-ranks 2 --out $OUT
(2 GPUs: `--trainer-ranks 1 --rollout-ranks 1`.)
CPU smoke test (gloo, a tiny model, 2 trainer ranks, 1 rollout rank):
    PYTHONPATH=. python benchmarks/weight_push.py --smoke --out /tmp/weight_push

For each of the Qwen2.5-0.5B, 1.5B and 7B shapes (random weights; 7B untied, vocab 152064), the
trainer's ranks hold the policy as the actor does: fp32, FSDP2-sharded (`distributed.fsdp.apply_fsdp`)
over K processes. Each push runs the project's own code end to end: `WeightSync.send` (every rank
gathers the full tensors, one at a time; rank 0 stages them in the wire dtype, bf16 on GPUs, and
broadcasts them over the NCCL weight channel in buckets of `--bucket-mb` from its background
thread) and, on each rollout rank, `workers.rollout.load_push` into a native engine
(`NativeRolloutEngine.load_weights`). `--staging` (default `both`: host, then device, for each
model in the same processes, an A/B) picks where rank 0 stages a push
(rollout.update_weights_staging, distributed/weight_staging.py): `host` (a pinned arena, reused),
`device` (buckets on its GPU), `auto` (the option's own choice, shown as `auto:device` or
`auto:host`). Times, from a clock shared by the processes (CLOCK_MONOTONIC), median of `--pushes`
after `--warmup`:
- `blocked_ms`: the trainer's part (`timing_s/stage_weights`): gather + staging, on the host's
  clock; the trainer's next call can start then;
- `stream_ms`: until the trainer's CUDA stream has run the gathers and staging copies (its next
  kernels start then; the broadcasts run on a stream of their own);
- `sent_ms`: until the sender's last broadcast finished;
- `push_ms`: until the last rollout rank has loaded the last tensor into its engine;
- verified pushes (rollout.weight_checksum_interval): the same with checksums on both sides, and
  the checksums' own times (sender, on its device bucket by bucket; receiver, over the engine's
  weights).
Prints a markdown table and writes weight_push.json to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import MODELS as ROLLOUT_MODELS  # noqa: E402  (the Qwen2.5 shapes, one table for both benchmarks)

# the tiny smoke model untied, so the push carries an LM head of its own as 7B's does
MODELS = {**ROLLOUT_MODELS, "tiny": dict(ROLLOUT_MODELS["tiny"], tie_word_embeddings=False)}


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)  # one clock for every process of the host


def _config(name: str):
    from transformers import Qwen2Config

    return Qwen2Config(**MODELS[name])


class _TrainerState:
    """What `WeightSync` reads of the actor's `TrainEngine`: the sharded model, its device, the
    autocast dtype (the wire dtype) and the optimizer steps taken (no optimizer is needed here)."""

    def __init__(self, model, device: torch.device):
        from hybridrl.workers.engine import autocast_dtype

        self.model, self.device, self.amp, self.steps_taken = model, device, autocast_dtype(device), 0


def _sharded_policy(name: str, device: torch.device, ranks: int):
    """The policy as the actor's ranks hold it: fp32, FSDP2 over `ranks`, random weights. Built on the
    meta device and sharded before it is materialized (a 7B model never exists whole on one rank)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM

    from hybridrl.distributed.fsdp import apply_fsdp

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_config(name), dtype=torch.float32)
    apply_fsdp(model, device, mesh=init_device_mesh(device.type, (ranks,)))
    model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(dist.get_rank())
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0.0, 0.02, generator=g)
    return model


def _trainer(rank: int, args, port_queue, results) -> None:
    """One rank of the trainer's pool; rank 0 is the weight channel's sender."""
    from hybridrl.config.schema import ModelConfig
    from hybridrl.workers.policy import PolicyWeights
    from hybridrl.workers.weight_sync import WeightSync

    device = _device(args, rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=args.trainer_ranks)
    members = 1 + args.rollout_ranks
    for name in args.models:
        state = _TrainerState(_sharded_policy(name, device, args.trainer_ranks), device)
        sync = WeightSync(state, PolicyWeights(ModelConfig()))
        port = sync.host_channel("127.0.0.1")
        if rank == 0:
            for _ in range(args.rollout_ranks):
                port_queue.put(port)
        sync.join_channel("127.0.0.1", port, members, args.bucket_mb, checksum_interval=0)
        for staging in args.stagings:
            if rank == 0:
                sync.sender.stager.mode = staging
            rows = []
            for i in range(args.warmup + 2 * args.pushes):
                if rank == 0:  # plain pushes, then verified ones
                    sync.sender.checksum_interval = 1 if i >= args.warmup + args.pushes else 0
                dist.barrier()
                t0 = _now()
                state.steps_taken += 1  # an optimizer step moved the policy: the whole of it goes
                metrics = sync.send()
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()  # the trainer's stream only
                stream_t = _now()
                if rank == 0:
                    sync.sender.wait()
                    rows.append(
                        {
                            "t0": t0,
                            "blocked_s": metrics["timing_s/stage_weights"],
                            "stream_t": stream_t,
                            "sent_t": _now(),
                            "bytes": metrics["rollout_pool/bytes_sent"],
                            "device_staging": metrics["rollout_pool/device_staging"],
                        }
                    )
            if rank == 0:
                results.put(("trainer", name, staging, rows))
        if rank == 0:
            while sync.sender.store.add("bench/done", 0) < args.rollout_ranks:  # the store lives here
                time.sleep(0.05)
        del sync, state
        if device.type == "cuda":
            torch.cuda.empty_cache()
        dist.barrier()
    dist.destroy_process_group()


def _rollout(r: int, args, port_queue, results) -> None:
    """One rollout rank: a native engine on its own device, fed by the weight channel."""
    from hybridrl.distributed.weight_channel import WeightChannel, WeightReceiver
    from hybridrl.rollout.native.engine import NativeRolloutEngine
    from hybridrl.workers.rollout import load_push

    device = _device(args, args.trainer_ranks + r)
    members = 1 + args.rollout_ranks
    for name in args.models:
        config = _config(name)
        tokenizer = SimpleNamespace(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)  # no vocabulary
        engine = NativeRolloutEngine(
            config, tokenizer, device=device, max_model_len=64, max_num_seqs=4, eos_token_ids=[config.eos_token_id]
        )
        receiver = WeightReceiver(WeightChannel("127.0.0.1", port_queue.get(), 1 + r, members, device))
        for staging in args.stagings:
            rows = []
            for _ in range(args.warmup + 2 * args.pushes):
                times = load_push(receiver, engine, device)
                rows.append({"loaded_t": _now(), **(times or {})})
            results.put(("rollout", name, staging, r, rows))
        receiver.channel.store.add("bench/done", 1)  # the last checksums are read: rank 0 may close the channel
        del engine, receiver
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _device(args, index: int) -> torch.device:
    """This process's device: GPU `index` (made the current one, for NCCL), or the CPU."""
    if args.device != "cuda":
        return torch.device("cpu")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _median_ms(values) -> float:
    return round(statistics.median(values) * 1e3, 2)


def summarize(name: str, staging: str, trainer: list[dict], rollouts: list[list[dict]], warmup: int, pushes: int) -> dict:
    """Medians of the timed pushes: plain ones, then verified ones. `staging`: as asked; auto's
    rows say what it chose (the timed pushes' staging)."""
    sent = trainer[-1]["bytes"]
    used = {"device" if trainer[i]["device_staging"] else "host" for i in range(warmup, len(trainer))}
    if staging == "auto":
        staging = "auto:" + "/".join(sorted(used))
    row = {"model": name, "staging": staging, "bytes": sent, "megabytes": round(sent / 1e6, 2)}
    for kind, first in (("plain", warmup), ("verified", warmup + pushes)):
        idx = range(first, first + pushes)
        loaded = [max(rs[i]["loaded_t"] for rs in rollouts) for i in idx]
        row[kind] = {
            "blocked_ms": _median_ms([trainer[i]["blocked_s"] for i in idx]),
            "stream_ms": _median_ms([trainer[i]["stream_t"] - trainer[i]["t0"] for i in idx]),
            "sent_ms": _median_ms([trainer[i]["sent_t"] - trainer[i]["t0"] for i in idx]),
            "push_ms": _median_ms([t - trainer[i]["t0"] for t, i in zip(loaded, idx)]),
            "checked": sum("receiver_ms" in rs[i] for rs in rollouts for i in idx),  # rank-pushes verified
        }
        if kind == "verified":
            row[kind]["sender_checksum_ms"] = round(statistics.median(rollouts[0][i]["sender_ms"] for i in idx), 2)
            row[kind]["receiver_checksum_ms"] = round(
                statistics.median(max(rs[i]["receiver_ms"] for rs in rollouts) for i in idx), 2
            )
    row["push_gb_per_s"] = round(sent / 1e9 / (row["plain"]["push_ms"] / 1e3), 3)
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | staging | MB sent | trainer blocked ms | trainer stream ms | sent ms | push ms | GB/s "
        "| verified push ms | checksum ms sender / receiver |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        p, v = r["plain"], r["verified"]
        cells = [r["model"], r["staging"], r["megabytes"], p["blocked_ms"], p["stream_ms"], p["sent_ms"], p["push_ms"]]
        cells += [r["push_gb_per_s"], v["push_ms"], f"{v['sender_checksum_ms']} / {v['receiver_checksum_ms']}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def _next(results, procs):
    """The next result; a process that died (its traceback is on stderr) ends the run."""
    while True:
        try:
            return results.get(timeout=5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise SystemExit("weight_push: a process failed (its error is above)") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B"], choices=list(MODELS))
    ap.add_argument("--trainer-ranks", type=int, default=2)
    ap.add_argument("--rollout-ranks", type=int, default=2)
    ap.add_argument("--bucket-mb", type=float, default=512.0, help="rollout.update_weights_bucket_megabytes")
    ap.add_argument("--pushes", type=int, default=5, help="timed pushes of each kind (plain, verified)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--staging",
        choices=["auto", "device", "host", "both"],
        default="both",
        help="rollout.update_weights_staging; both = host, then device, for each model",
    )
    ap.add_argument("--smoke", action="store_true", help="CPU, gloo, the tiny model, 2 trainer ranks + 1 rollout rank")
    ap.add_argument("--out", default="weight_push_out")
    args = ap.parse_args()
    args.stagings = ["host", "device"] if args.staging == "both" else [args.staging]
    if args.smoke:
        args.device, args.models, args.trainer_ranks, args.rollout_ranks = "cpu", ["tiny"], 2, 1
        args.pushes, args.warmup, args.bucket_mb = 3, 1, 0.01  # several buckets even for the tiny model
    else:
        args.device = "cuda"
        need = args.trainer_ranks + args.rollout_ranks
        if torch.cuda.device_count() < need:
            raise SystemExit(
                f"weight_push: {need} GPUs needed (--trainer-ranks + --rollout-ranks), {torch.cuda.device_count()} found"
            )
    import socket

    with socket.socket() as s:  # the trainer's default group (the channel's store picks its own port)
        s.bind(("127.0.0.1", 0))
        args.port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    port_queue, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_trainer, args=(k, args, port_queue, results)) for k in range(args.trainer_ranks)]
    procs += [ctx.Process(target=_rollout, args=(r, args, port_queue, results)) for r in range(args.rollout_ranks)]
    for p in procs:
        p.start()
    runs = [(name, staging) for name in args.models for staging in args.stagings]
    got: dict[tuple[str, str], dict] = {run: {"rollouts": {}} for run in runs}
    for _ in range(len(runs) * (1 + args.rollout_ranks)):
        msg = _next(results, procs)
        if msg[0] == "trainer":
            got[msg[1], msg[2]]["trainer"] = msg[3]
        else:
            got[msg[1], msg[2]]["rollouts"][msg[3]] = msg[4]
    for p in procs:
        p.join(timeout=300)
        if p.exitcode != 0:
            raise SystemExit(f"weight_push: a process exited with {p.exitcode}")
    rows = []
    for name, staging in runs:
        trainer, rollouts = got[name, staging]["trainer"], list(got[name, staging]["rollouts"].values())
        rows.append(summarize(name, staging, trainer, rollouts, args.warmup, args.pushes))
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    result = {
        "device": device,
        "trainer_ranks": args.trainer_ranks,
        "rollout_ranks": args.rollout_ranks,
        "bucket_mb": args.bucket_mb,
        "staging": args.staging,
        "pushes": args.pushes,
        "warmup": args.warmup,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "weight_push.json").write_text(json.dumps(result, indent=2))
    print(
        f"{device}: trainer FSDP2 on {args.trainer_ranks}, {args.rollout_ranks} rollout rank(s), buckets of {args.bucket_mb} MB"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
