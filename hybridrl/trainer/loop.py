"""The loop every trainer runs: stepping, the cadence of validation and checkpoints, logging, guards.

A trainer (RL in `ppo.py`; DPO/KTO and SFT in `offline.py`) subclasses `Trainer` and defines what
one step is (`step(batch) -> metrics`), and where it has them, its validation (`validate`) and the
state it checkpoints beside the workers' (`state_dict`, e.g. the KL controller's). Everything
around a step is here, once:

    before the first step: warm-up metrics and (trainer.val_before_train) validation, as step 0
    each step: next batch -> step (profiled on trainer.profile_steps) -> rates -> validation every
      trainer.test_freq steps and on the last -> log -> non-finite guard -> checkpoint every
      trainer.save_freq steps and on the last (then the fault-injection hook tests use)
    the last step: trainer.total_training_steps reached or trainer.max_wall_time_s spent
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from hybridrl.config import Config
from hybridrl.data.batch import Batch
from hybridrl.trainer.alarms import Alarms, run_alarms
from hybridrl.trainer.setup import RunContext


class NonFiniteError(RuntimeError):
    """Too many updates in a row of one role had a non-finite loss or gradient norm."""


# Where each role's optimizer settings live in the config, for the non-finite message.
_ROLE_CONFIG = {"actor": "actor_rollout_ref.actor", "critic": "critic"}


class Trainer:
    """Base of every trainer: `fit` is the loop; a subclass gives `step` (and `validate`, `state_dict`)."""

    def __init__(self, cfg: Config, run: RunContext):
        self.cfg, self.run = cfg, run
        self.alarms = Alarms(run_alarms(cfg))  # once-per-run warnings (trainer/alarms.py)

    def step(self, batch: Batch) -> dict:
        """One training step on the loader's next batch; returns its metrics, with
        `perf/total_num_tokens` (the tokens it trained on) and `{role}/nonfinite_in_a_row`."""
        raise NotImplementedError

    def has_validation(self) -> bool:
        """Whether the run has held-out data to validate on (the RL loop: data.val_files prompts)."""
        return bool(self.run.val_records)

    def validate(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        """Trainer state saved in each checkpoint's trainer_state.json (and back in run.trainer_state)."""
        return {}

    def rates(self, batch: Batch, metrics: dict, seconds: float) -> dict:
        """Per-second numbers of a step that took `seconds` (the step cannot time itself whole)."""
        return {"perf/throughput": metrics["perf/total_num_tokens"] / seconds}

    def fit(self) -> dict:
        run, t = self.run, self.cfg.trainer
        if run.global_step == 0:
            self._log_before_training()
        metrics: dict = {}
        while run.global_step < run.total_steps:
            run.global_step += 1
            metrics = self._timed_step()
            last = is_last_step(run)
            if self.has_validation() and (last or _every(t.test_freq, run.global_step)):
                metrics.update(self.validate())
            run.tracker.log(metrics, step=run.global_step)
            self.alarms.check(metrics, run.global_step)
            last = last or is_last_step(run)  # an API callback may end the run here (trainer/callbacks.py)
            check_finite(metrics, t.max_nonfinite_steps)
            if last or _every(t.save_freq, run.global_step):
                run.save_checkpoint(self.state_dict())
                fault_injection_point(run.global_step)
            if last:
                break
        run.finish()
        return metrics

    def _log_before_training(self) -> None:
        run = self.run
        before = dict(run.trainer_state.pop("warmup_metrics", {}))
        if self.cfg.trainer.val_before_train and self.has_validation():
            before.update(self.validate())
        if before:
            run.tracker.log(before, step=0)

    def _timed_step(self) -> dict:
        run = self.run
        t0 = time.perf_counter()
        batch = run.loader.next_batch()
        with profiled(run):
            metrics = self.step(batch)
        seconds = time.perf_counter() - t0
        metrics["timing_s/step"] = seconds
        metrics.update(self.rates(batch, metrics, seconds))
        metrics["training/global_step"] = run.global_step
        metrics["training/epoch"] = run.loader.epoch
        return metrics


def _every(freq: int, step: int) -> bool:
    return freq > 0 and step % freq == 0


def is_last_step(run: RunContext) -> bool:
    """The step just taken ends the run: the step count is reached, or the wall-clock budget
    (`trainer.max_wall_time_s`, counted from when the run was launched) is spent."""
    limit = run.cfg.trainer.max_wall_time_s
    return run.global_step >= run.total_steps or (limit is not None and time.perf_counter() - run.started >= limit)


def check_finite(metrics: dict, limit: int) -> None:
    """Stop when a role's updates were skipped for a non-finite loss or gradient `limit` times in a
    row; the checkpoint before them is intact (skipped updates leave the weights untouched)."""
    for key, n in metrics.items():
        if key.endswith("/nonfinite_in_a_row") and n >= limit:
            role = key.split("/")[0]
            where = _ROLE_CONFIG.get(role, role)
            raise NonFiniteError(
                f"{role}: {int(n)} updates in a row had a non-finite loss or gradient norm "
                f"(trainer.max_nonfinite_steps={limit}); the last good checkpoint is intact. Lower {where}.optim.lr, "
                f"check the data and rewards for inf/NaN, or set {where}.grad_clip."
            )


@contextlib.contextmanager
def profiled(run: RunContext):
    """Around one step: torch.profiler in every worker process when the step is one of
    `trainer.profile_steps` (hybridrl/tracking/profiler.py); nothing otherwise."""
    step = run.global_step
    if step not in run.cfg.trainer.profile_steps:
        yield
        return
    out = run.dir / "profile" / f"step_{step}"
    pool = run.workers.get("rollout") if run.workers is not None else None  # resource_pool.rollout's ranks
    groups = [g for g in (run.actor, run.critic, pool) if g is not None]
    for g in groups:
        g.start_profile(str(out))
    try:
        yield
    finally:
        tables = [t for g in groups for t in g.stop_profile() if t]
        print(f"[hybridrl] step {step} profiled: {len(tables)} trace(s) and op table(s) in {out}", flush=True)


def fault_injection_point(step: int) -> None:
    """Tests kill the process right after a checkpoint to prove resume is exact."""
    if os.environ.get("HYBRIDRL_KILL_AFTER_SAVE_STEP") == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
