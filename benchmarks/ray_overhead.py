"""What the Ray backend costs on top of the work, on CPU with 2 worker processes (gloo):
startup, the round trip of a `dp` call (split, send, receive, concatenate), and how long the
controller takes to report a worker process killed mid-step.

    python benchmarks/ray_overhead.py        # prints the rows of BENCHMARKS.md's runtime-costs table
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch
from ray import cloudpickle

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.data.batch import Batch
from hybridrl.data.converters import make_arith
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.groups import WorkerDiedError
from hybridrl.distributed.ray_backend import RayBackend
from hybridrl.models.tiny import write_tiny_model_dir
from hybridrl.trainer.ppo import PPOTrainer
from hybridrl.trainer.supervise import fit_with_restarts


class Echo:
    def __init__(self, cfg, plan, device):
        pass

    @register(Dispatch.DP)
    def echo(self, batch: Batch) -> Batch:
        return batch


def config(tmp: Path, data: dict, model: str, **trainer):
    return config_from_dict(
        {
            "data": {"train_files": data["train"], "train_batch_size": 4, "max_prompt_length": 8, "max_response_length": 4},
            "actor_rollout_ref": {
                "model": {"path": model, "random_init": True},
                "actor": {"ppo_mini_batch_size": 4},
                "rollout": {"n": 2},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "trainer": {"device": "cpu", "n_gpus_per_node": 2, "logger": ["jsonl"], "val_before_train": False, **trainer},
        }
    )


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    data = make_arith(str(tmp / "arith"), n_train=64, n_test=16, n_sft=64, max_operand=20, seed=0)
    model = str(write_tiny_model_dir(tmp / "tiny", hidden_size=32, intermediate_size=64))
    t0 = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    t1 = time.perf_counter()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = config(tmp, data, model)
    backend = RayBackend(cfg, plan_batches(cfg), {"echo": Echo})
    t2 = time.perf_counter()
    print(f"| ray.init (local cluster) | {t1 - t0:.1f} s |")
    print(f"| 2 worker processes + gloo group | {t2 - t1:.1f} s |")
    group = backend.groups["echo"]
    for rows, width in ((256, 512), (1024, 1024)):
        batch = Batch(
            {
                "responses": torch.randint(0, 1000, (rows, width)),
                "mask": torch.ones(rows, width),
                "log_probs": torch.randn(rows, width),
            },
            {"text": ["x" * 200] * rows},
        )
        times = []
        for _ in range(10):
            start = time.perf_counter()
            group.echo(batch)
            times.append(time.perf_counter() - start)
        mib = sum(t.numel() * t.element_size() for t in batch.tensors.values()) / 2**20
        print(
            f"| `dp` round trip, {rows} rows x {width} ({mib:.0f} MiB of tensors + text) | "
            f"{statistics.median(times) * 1e3:.0f} ms (median of 10) |"
        )
    backend.shutdown()
    delays = []
    for trial in range(3):
        flag = tmp / f"killed_{trial}"
        os.environ["HYBRIDRL_KILL_WORKER"] = f"update_actor:1:3:{flag}"
        cfg = config(tmp, data, model, total_training_steps=3, save_freq=2, default_local_dir=str(tmp / f"run{trial}"))
        try:
            fit_with_restarts(cfg, PPOTrainer)
        except WorkerDiedError:
            delays.append(time.time() - float(flag.read_text().split()[1]))
    print(
        f"| SIGKILL of rank 1 mid-update -> WorkerDiedError in the controller (workers stopped) | "
        f"{', '.join(f'{d:.2f}' for d in delays)} s (3 runs) |"
    )


if __name__ == "__main__":
    main()
