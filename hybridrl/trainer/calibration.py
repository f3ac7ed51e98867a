"""resource_pool.rollout=auto: measure the workload, choose the split, re-form the worker groups, go on.

    1. The first resource_pool.rollout_auto_steps steps are real training steps, run colocated on all
       of a node's devices in sync mode (logged and checkpointed like any other).
    2. Their timing_s/* metrics give the StepTimes of `auto_split.choose_split`, which returns the
       rollout devices r, or None (stay colocated); the step logs `resource_pool/rollout_auto` = r
       (0: colocated) and one line that says why.
    3. A split stops this run after the calibration step, with its checkpoint; new worker groups,
       n - r for the actor and r for the rollout pool, resume from that checkpoint in the configured
       trainer.mode (any world size resumes any checkpoint: distributed/checkpoint.py). Staying
       colocated, the same run just goes on, in sync mode (colocated, an off-policy mode would only
       add staleness: trainer/async_rollout.py).

After CHECK_STEPS steps on a fresh split, `resource_pool/rollout_auto_speedup` (colocated sync's
measured step over the split's) and a log line say whether the split pays as predicted.
Every later checkpoint's trainer state holds the split (`rollout_auto`: r and the devices per
node it was chosen for), so a resumed run on as many devices takes it without calibrating again;
the run's config.yaml shows the resolved pools.
"""

from __future__ import annotations

import copy
import statistics

from hybridrl.trainer import checkpoint as ckpt
from hybridrl.trainer.auto_split import SplitDecision, choose_split, measured_times
from hybridrl.trainer.rundir import checkpoints_dir, find_resume

KEY = "resource_pool/rollout_auto"  # the metric: rollout devices per node, 0 = colocated
STATE = "rollout_auto"  # the trainer-state entry: {"rollout": r, "devices_per_node": n}
CHECK_STEPS = 3  # steps on a fresh split timed against the calibration's colocated sync step


def fit_auto_split(cfg, make_trainer, fit) -> dict:
    """`fit(cfg, make_trainer)` (trainer/supervise.py's restarting loop) for a config with
    resource_pool.rollout=auto: calibrate (unless the checkpoint resumed says the split), then the split."""
    rollout, calibration = recorded_split(cfg), None
    if rollout is None:
        calibration = Calibration(cfg)
        metrics = fit(calibration_config(cfg), lambda c: calibration.attach(make_trainer(c)))
        if calibration.decision is None or not calibration.decision.rollout:
            return metrics  # the run ended while calibrating, or went on colocated
        rollout = calibration.decision.rollout
        cfg = ckpt.resume_config(cfg, ckpt.latest_checkpoint(checkpoints_dir(cfg)))
        n = cfg.trainer.n_gpus_per_node
        print(f"[hybridrl] resource_pool.rollout=auto: re-forming the worker groups, {n - rollout} + {rollout}", flush=True)
    decision = calibration.decision if calibration is not None else None
    return fit(split_config(cfg, rollout), lambda c: _on_split(make_trainer(c), rollout, decision))


def recorded_split(cfg) -> int | None:
    """The split the checkpoint this run resumes from was trained with (0: colocated), or None."""
    path = find_resume(cfg)
    if path is None:
        return None
    saved, n = ckpt.load_trainer_state(path).get(STATE), cfg.trainer.n_gpus_per_node
    if saved is None:
        return None
    if saved["devices_per_node"] != n:
        print(
            f"[hybridrl] resource_pool.rollout=auto: {path} was trained split for {saved['devices_per_node']} devices "
            f"per node, this run has {n}: calibrating again",
            flush=True,
        )
        return None
    return saved["rollout"]


def calibration_config(cfg):
    """The config of the calibration steps: every role on all of a node's devices, sync mode."""
    cal = copy.deepcopy(cfg)
    cal.resource_pool.rollout = None
    cal.trainer.mode = "sync"
    cal.async_training.partial_rollout = False
    return cal


def split_config(cfg, rollout: int):
    """`cfg` with resource_pool.rollout=auto resolved: `rollout` devices per node for the rollout pool
    and the rest for the actor; 0 = colocated in sync mode."""
    out = copy.deepcopy(cfg)
    pool, n = out.resource_pool, out.trainer.n_gpus_per_node
    if rollout:
        pool.rollout, pool.actor_rollout_ref = rollout, n - rollout
    else:
        out = calibration_config(out)
    return out


def candidates(cfg) -> list[int]:
    """The rollout devices r whose split config has no problem (batch sizes that divide over n - r);
    each r left out is said with its first problem."""
    from hybridrl.config.validate import find_problems

    n, out = cfg.trainer.n_gpus_per_node, []
    for r in range(1, n):
        problems = find_problems(split_config(cfg, r))
        if problems:
            print(f"[hybridrl] resource_pool.rollout=auto: {n - r} + {r} is not a candidate: {problems[0].message}", flush=True)
        else:
            out.append(r)
    return out


class Calibration:
    """Watches the calibration steps' metrics; after the last, decides and records the split."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.steps = cfg.resource_pool.rollout_auto_steps
        self.rows: list[dict] = []
        self.decision: SplitDecision | None = None

    def attach(self, trainer):
        """`trainer` with its run's tracker and checkpoints seen through this calibration."""
        run = trainer.run
        run.tracker = _CalibratingTracker(run.tracker, run, self)
        save, finish = run.save_checkpoint, run.finish
        run.save_checkpoint = lambda state: save(self._state(state))
        run.finish = lambda: self._finish(run, finish)
        return trainer

    def _finish(self, run, finish) -> None:
        """Before a split the run goes on in new groups: stop these without an end-of-run summary."""
        if self.decision is None or not self.decision.rollout or run.closed:
            finish()
            return
        run.tracker.close()
        run.closed = True
        run.shutdown()

    def _state(self, state: dict) -> dict:
        return state if self.decision is None else {**state, **_record(self.cfg, self.decision.rollout or 0)}

    def observe(self, metrics: dict, run) -> None:
        """After a calibration step's metrics: decide after the last; stop the run here for a split."""
        self.rows.append(dict(metrics))
        if len(self.rows) < self.steps:
            return
        rows = self.rows[1:] if len(self.rows) > 1 else self.rows  # the first step warms up (graphs, caches)
        cfg = self.cfg
        per_node = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n // cfg.trainer.nnodes
        times = measured_times(rows, per_node, cfg.actor_rollout_ref.rollout.max_num_seqs)
        n = cfg.trainer.n_gpus_per_node
        self.decision = choose_split(n, times, cfg.resource_pool.rollout_auto_min_gain, candidates(cfg))
        metrics[KEY] = float(self.decision.rollout or 0)
        metrics["resource_pool/rollout_auto_predicted_step_s"] = self.decision.step_s
        print(f"[hybridrl] resource_pool.rollout=auto after {len(self.rows)} step(s): {self.decision.reason}", flush=True)
        if self.decision.rollout:
            r = self.decision.rollout
            print(
                f"[hybridrl] the same split without calibrating: resource_pool.rollout={r} "
                f"resource_pool.actor_rollout_ref={n - r} trainer.mode={cfg.trainer.mode}",
                flush=True,
            )
            run.total_steps = min(run.total_steps, run.global_step)  # this step is the phase's last, checkpointed
        else:
            print("[hybridrl] going on colocated in trainer.mode=sync", flush=True)


class _CalibratingTracker:
    """The run's tracker, showing each calibration step's metrics to the Calibration before logging them."""

    def __init__(self, inner, run, calibration: Calibration):
        self.inner, self.run, self.calibration = inner, run, calibration

    def log(self, metrics: dict, step: int) -> None:
        if step > 0 and self.calibration.decision is None:
            self.calibration.observe(metrics, self.run)
        self.inner.log(metrics, step)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _on_split(trainer, rollout: int, decision: SplitDecision | None):
    """`trainer` whose checkpoints record the split it runs, for a later resume, and which (right
    after calibrating) compares the split's measured steps with the colocated sync step."""
    run = trainer.run
    save = run.save_checkpoint
    run.save_checkpoint = lambda state: save({**state, **_record(trainer.cfg, rollout)})
    if decision is not None:
        run.tracker = _SplitCheck(run.tracker, decision)
    return trainer


def _record(cfg, rollout: int) -> dict:
    return {STATE: {"rollout": rollout, "devices_per_node": cfg.trainer.n_gpus_per_node}}


class _SplitCheck:
    """The run's tracker; after CHECK_STEPS steps on the split (and the first, whose queue starts
    empty), logs `resource_pool/rollout_auto_speedup`: colocated sync's step over the split's median."""

    def __init__(self, inner, decision: SplitDecision):
        self.inner, self.decision, self.steps = inner, decision, []

    def log(self, metrics: dict, step: int) -> None:
        if step > 0 and len(self.steps) <= CHECK_STEPS and "timing_s/step" in metrics:
            self.steps.append(metrics["timing_s/step"])
            if len(self.steps) == CHECK_STEPS + 1:
                d, measured = self.decision, statistics.median(self.steps[1:])
                metrics["resource_pool/rollout_auto_speedup"] = d.colocated_s / measured
                line = (
                    f"[hybridrl] resource_pool.rollout=auto: the split runs at {measured:.2f} s per step (predicted "
                    f"{d.step_s:.2f} s), {d.colocated_s / measured:.2f}x colocated sync's {d.colocated_s:.2f} s"
                )
                if measured > d.colocated_s:
                    line += "; slower than colocated: resume with resource_pool.rollout=null trainer.mode=sync"
                print(line, flush=True)
        self.inner.log(metrics, step)

    def __getattr__(self, name):
        return getattr(self.inner, name)
