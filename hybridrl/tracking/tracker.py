"""Where metrics go: console lines, metrics.jsonl, TensorBoard, and optionally W&B / MLflow / SwanLab.

`metrics.jsonl` is the source of truth (one JSON object per step, verl's metric names) and is
always written: `hybridrl report` and `hybridrl dashboard` read it. The other backends are views
of it, under the same names. `trainer.logger` takes verl's values (`file` is verl's name for the
JSONL file). On resume, lines past the resumed step are dropped first so that the file never
holds the same step twice.
"""

from __future__ import annotations

import collections
import json
import math
import os
import statistics
import threading
import time
from pathlib import Path

LOGGERS = ("console", "jsonl", "file", "tensorboard", "wandb", "mlflow", "swanlab")


def _fmt_duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


_FIRST_NOTICE: list[float] = []


def launched_at() -> float | None:
    """perf_counter() of the first start-up notice of this process, if any."""
    return _FIRST_NOTICE[0] if _FIRST_NOTICE else None


def notice(msg: str) -> None:
    """A start-up line saying what is loading now, with the seconds since the first such line,
    so a newcomer sees progress (and where the time goes) before the first step."""
    now = time.perf_counter()
    if not _FIRST_NOTICE:
        _FIRST_NOTICE.append(now)
    print(f"[hybridrl {now - _FIRST_NOTICE[0]:5.1f}s] {msg}", flush=True)


class ConsoleLogger:
    """One line per step: progress, ETA, and the numbers people watch, each under its
    metrics.jsonl name (`critic/score/mean 0.412`), so what the console shows can be found in the
    file, TensorBoard and the report. The ETA is the smaller of the step-rate estimate and the
    wall-clock budget left (`trainer.max_wall_time_s`)."""

    FIELDS = (
        ("critic/score/mean", "{:.3f}"),
        ("actor/reward_kl_penalty", "{:.4f}"),
        ("actor/kl_loss", "{:.4f}"),
        ("response_length/mean", "{:.1f}"),
        ("loss", "{:.4f}"),  # dpo / kto / sft
        ("rewards/accuracies", "{:.3f}"),
        ("rewards/margins", "{:.3f}"),
        ("kl", "{:.4f}"),
        ("mean_token_accuracy", "{:.3f}"),
        ("timing_s/step", "{:.2f}"),
    )

    def __init__(self, total_steps: int, start_step: int = 0, max_wall_time_s: float | None = None):
        self.total, self.start_step, self.t0 = total_steps, start_step, time.perf_counter()
        self.max_wall_time_s, self.launched = max_wall_time_s, time.perf_counter()
        self.t1: float | None = None  # when the first step of this process ended
        self.last: float | None = None  # when the previous step's line was printed
        self.durations: collections.deque[float] = collections.deque(maxlen=64)  # the last steps' seconds

    def log(self, metrics: dict, step: int) -> None:
        if step == self.start_step:  # the pre-training line: time the ETA from here, not from load
            self.t0 = time.perf_counter()
        elif step == self.start_step + 1:
            self.t1 = time.perf_counter()
        elif self.last is not None:
            self.durations.append(time.perf_counter() - self.last)
        self.last = time.perf_counter()
        parts = [f"step {step}/{self.total}"]
        parts += [f"{key} {fmt.format(metrics[key])}" for key, fmt in self.FIELDS if key in metrics]
        for key in ("reward/errors", "reward/timeouts", "val-aux/reward/errors", "val-aux/reward/timeouts"):
            if metrics.get(key):  # shown only when a reward call failed (hybridrl/rewards/pool.py)
                parts.append(f"{key} {int(metrics[key])}")
        val = {k: v for k, v in metrics.items() if k.startswith(("val-core/", "val/"))}
        parts += [f"{k} {v:.3f}" for k, v in val.items()]
        eta = self.eta(step)
        if eta is not None:
            parts.append(f"eta {_fmt_duration(eta)}")
        print(" | ".join(parts), flush=True)

    def eta(self, step: int, now: float | None = None) -> float | None:
        """Seconds left: (time per step) x (steps left), capped by the wall-clock budget
        left; None before the first step and after the last. The time per step leaves out the
        first step once there is another: it compiles and warms up (on a GPU often 10x a later
        step), which made early estimates several times too long. From the fourth step on, the time
        per step is the median of the last 64 steps: a mean jumped from 4m48s to 40m16s after one
        slow step."""
        now = time.perf_counter() if now is None else now
        done = step - self.start_step
        if done <= 0 or step >= self.total:
            return None
        per_step = (now - self.t1) / (done - 1) if self.t1 is not None and done >= 2 else (now - self.t0) / done
        if len(self.durations) >= 3:  # the median of the last steps: one slow step (a validation, a hiccup) moves it little
            per_step = statistics.median(self.durations)
        eta = per_step * (self.total - step)
        if self.max_wall_time_s is not None:
            eta = min(eta, max(0.0, self.max_wall_time_s - (now - self.launched)))
        return eta


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
        print(
            f"[hybridrl] note: {path}: skipped {bad} unreadable line(s) (a partial last line of an interrupted run)", flush=True
        )
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
    # The event writer's thread sleeps up to flush_secs between flushes (120 s by default); a close
    # after Ctrl-C was seen waiting that out (85-115 s). A short period bounds it, and `close` waits
    # CLOSE_S at most: every step already flushed its events, so nothing logged is lost.
    FLUSH_S, CLOSE_S = 5, 5.0

    def __init__(self, log_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir), flush_secs=self.FLUSH_S)

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self):
        closing = threading.Thread(target=self.writer.close, name="hybridrl-tensorboard-close", daemon=True)
        closing.start()
        closing.join(self.CLOSE_S)
        if closing.is_alive():
            print(f"[hybridrl] TensorBoard: its event writer did not close within {self.CLOSE_S:g} s; left behind", flush=True)


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


class SwanlabLogger:
    def __init__(self, project: str, name: str, config: dict, run_dir: Path):
        try:
            import swanlab
        except ImportError as e:
            raise ImportError("trainer.logger includes 'swanlab' but swanlab is not installed: pip install swanlab") from e
        self.swanlab = swanlab
        swanlab.init(project=project, experiment_name=name, config=config, logdir=str(run_dir / "swanlab"))

    def log(self, metrics: dict, step: int) -> None:
        self.swanlab.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)

    def close(self):
        self.swanlab.finish()


class Tracker:
    def __init__(
        self, loggers, run_dir: Path, *, project: str, name: str, config: dict, total_steps: int, resume_step: int | None
    ):
        unknown = [x for x in loggers if x not in LOGGERS]
        if unknown:
            raise ValueError(f"unknown trainer.logger entries {unknown}; choose from {LOGGERS}")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        (run_dir / "run_summary.json").unlink(missing_ok=True)  # written again when this launch finishes
        # metrics.jsonl always: the report, the dashboard and the end-of-run summary read it.
        self.backends = [JsonlLogger(run_dir / "metrics.jsonl", resume_step)]
        wall = (config.get("trainer") or {}).get("max_wall_time_s") if isinstance(config, dict) else None
        for name_ in dict.fromkeys(loggers):
            if name_ == "console":
                self.backends.append(ConsoleLogger(total_steps, resume_step or 0, wall))
            elif name_ == "tensorboard":
                self.backends.append(TensorBoardLogger(run_dir / "tensorboard"))
            elif name_ == "wandb":
                self.backends.append(WandbLogger(project, name, config, run_dir))
            elif name_ == "mlflow":
                self.backends.append(MlflowLogger(project, name, config))
            elif name_ == "swanlab":
                self.backends.append(SwanlabLogger(project, name, config, run_dir))

    def log(self, metrics: dict, step: int) -> None:
        for b in self.backends:
            b.log(metrics, step)

    def close(self) -> None:
        for b in self.backends:
            if hasattr(b, "close"):
                b.close()
