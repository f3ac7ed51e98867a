"""Where metrics go: console lines, metrics.jsonl, TensorBoard, and optionally W&B / MLflow.

`metrics.jsonl` is the source of truth (one JSON object per step, verl's metric names); the
other backends are views of it. On resume, lines past the resumed step are dropped first so
that the file never holds the same step twice.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


def _fmt_duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class ConsoleLogger:
    """One line per step: progress, ETA, and the numbers people watch."""

    FIELDS = (
        ("critic/score/mean", "reward", "{:.3f}"),
        ("actor/reward_kl_penalty", "kl", "{:.4f}"),
        ("actor/kl_loss", "kl", "{:.4f}"),
        ("response_length/mean", "resp_len", "{:.1f}"),
        ("loss", "loss", "{:.4f}"),  # dpo / kto / sft
        ("rewards/accuracies", "acc", "{:.3f}"),
        ("rewards/margins", "margin", "{:.3f}"),
        ("kl", "kl", "{:.4f}"),
        ("mean_token_accuracy", "token_acc", "{:.3f}"),
        ("timing_s/step", "step_s", "{:.2f}"),
    )

    def __init__(self, total_steps: int, start_step: int = 0):
        self.total, self.start_step, self.t0 = total_steps, start_step, time.perf_counter()

    def log(self, metrics: dict, step: int) -> None:
        if step == self.start_step:  # the pre-training line: time the ETA from here, not from load
            self.t0 = time.perf_counter()
        parts = [f"step {step}/{self.total}"]
        shown = set()
        for key, label, fmt in self.FIELDS:
            if key in metrics and label not in shown:
                parts.append(f"{label} {fmt.format(metrics[key])}")
                shown.add(label)
        for key, label in (("reward/errors", "reward errors"), ("reward/timeouts", "of them timeouts"),
                           ("val-aux/reward/errors", "val reward errors")):  # fmt: skip
            if metrics.get(key):  # shown only when a reward call failed (hybridrl/rewards/pool.py)
                parts.append(f"{label} {int(metrics[key])}")
        val = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
        parts += [f"{k.removeprefix('val-core/')} {v:.3f}" for k, v in val.items()]
        done = step - self.start_step
        if 0 < done and step < self.total:
            eta = (time.perf_counter() - self.t0) / done * (self.total - step)
            parts.append(f"eta {_fmt_duration(eta)}")
        print(" | ".join(parts), flush=True)


def read_jsonl(path: Path) -> tuple[list[dict], int]:
    """The JSON objects of `path`, one per line, and how many lines were skipped: a run killed
    mid-write leaves a partial last line, which must not stop a resume or a report."""
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the rows of `path` up to `step` (resume), dropping (and reporting) broken lines."""
    if not path.exists():
        return
    rows, bad = read_jsonl(path)
    if bad:
        print(f"[hybridrl] note: {path}: skipped {bad} unreadable line(s) (a partial last line of an interrupted run)", flush=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows if r.get("step", 0) <= step))
    os.replace(tmp, path)


class JsonlLogger:
    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        if resume_step is not None:
            truncate_jsonl(path, resume_step)
        # A new run never finds another run's file here (hybridrl/trainer/rundir.py): append.
        self.f = path.open("a")

    def log(self, metrics: dict, step: int) -> None:
        clean = {k: (v if not (isinstance(v, float) and not math.isfinite(v)) else str(v)) for k, v in metrics.items()}
        self.f.write(json.dumps({"step": step, **clean}) + "\n")
        self.f.flush()

    def close(self):
        self.f.close()


class TensorBoardLogger:
    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class WandbLogger:
    def __init__(self, project: str, name: str, config: dict, run_dir: Path):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("trainer.logger includes 'wandb' but wandb is not installed: pip install wandb") from e
        self.run = wandb.init(project=project, name=name, config=config, dir=str(run_dir))

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self):
        self.run.finish()


class MlflowLogger:
    def __init__(self, project: str, name: str, config: dict):
        try:
            import mlflow
        except ImportError as e:
            raise ImportError("trainer.logger includes 'mlflow' but mlflow is not installed: pip install mlflow") from e
        self.mlflow = mlflow
        mlflow.set_experiment(project)
        mlflow.start_run(run_name=name)

    def log(self, metrics: dict, step: int) -> None:
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self):
        self.mlflow.end_run()


class Tracker:
    def __init__(self, loggers, run_dir: Path, *, project: str, name: str, config: dict, total_steps: int, resume_step: int | None):
        unknown = [x for x in loggers if x not in LOGGERS]
        if unknown:
            raise ValueError(f"unknown trainer.logger entries {unknown}; choose from {LOGGERS}")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.backends = []
        for name_ in loggers:
            if name_ == "console":
                self.backends.append(ConsoleLogger(total_steps, resume_step or 0))
            elif name_ == "jsonl":
                self.backends.append(JsonlLogger(run_dir / "metrics.jsonl", resume_step))
            elif name_ == "tensorboard":
                self.backends.append(TensorBoardLogger(run_dir / "tensorboard"))
            elif name_ == "wandb":
                self.backends.append(WandbLogger(project, name, config, run_dir))
            elif name_ == "mlflow":
                self.backends.append(MlflowLogger(project, name, config))

    def log(self, metrics: dict, step: int) -> None:
        for b in self.backends:
            b.log(metrics, step)

    def close(self) -> None:
        for b in self.backends:
            if hasattr(b, "close"):
                b.close()


def append_samples(path: Path, step: int, prompts, responses, scores, n: int) -> None:
    """A few prompt/response/score triples per step, for reading what the policy does."""
    with path.open("a") as f:
        for p, r, s in list(zip(prompts, responses, scores))[:n]:
            f.write(json.dumps({"step": step, "prompt": p, "response": r, "score": s}) + "\n")
