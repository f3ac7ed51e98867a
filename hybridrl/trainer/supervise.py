"""Run a trainer to the end, restarting its worker groups when a worker process dies.

A dead worker leaves the others of its group stuck in a collective, so the whole group is
stopped; with `trainer.max_restarts: N` fresh groups resume from the last good checkpoint
(the data position, optimizer and RNG states make the continuation the same run).
"""

from __future__ import annotations

import time

from hybridrl.distributed.groups import BackendError, WorkerDiedError
from hybridrl.trainer import checkpoint as ckpt
from hybridrl.trainer import rundir
from hybridrl.trainer.rundir import checkpoints_dir, run_dir


def fit_with_restarts(cfg, make_trainer) -> dict:
    """`make_trainer(cfg).fit()`, at most `trainer.max_restarts` more times after worker deaths.
    The run directory is locked throughout (hybridrl/trainer/rundir.py)."""
    with rundir.locked(run_dir(cfg)):
        if cfg.resource_pool.rollout == "auto":  # calibrate, then re-form the groups into the chosen split
            from hybridrl.trainer.calibration import fit_auto_split

            launched = time.perf_counter()  # trainer.max_wall_time_s spans the calibration and the split
            return fit_auto_split(cfg, make_trainer, lambda c, make: _fit_with_restarts(c, make, launched))
        return _fit_with_restarts(cfg, make_trainer)


def _fit_with_restarts(cfg, make_trainer, launched: float | None = None) -> dict:
    limit, launched = cfg.trainer.max_restarts, launched or time.perf_counter()
    for attempt in range(limit + 1):
        trainer = None
        try:
            trainer = make_trainer(cfg)
            # trainer.max_wall_time_s counts from this launch, not from the latest restart.
            trainer.run.started = launched
            return trainer.fit()
        except BackendError as e:
            if attempt == 0:
                raise
            # The restart found no cluster to run on (a lost node not replaced in time).
            last = ckpt.latest_checkpoint(checkpoints_dir(cfg))
            where = f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"
            raise BackendError(f"{e}; {where}. Resume with trainer.resume_mode=auto") from None
        except WorkerDiedError as e:
            last = ckpt.latest_checkpoint(checkpoints_dir(cfg))
            where = f"the last good checkpoint is {last}" if last else "no checkpoint had been written yet"
            if attempt == limit:
                raise WorkerDiedError(
                    f"{e}; {where}. Resume with trainer.resume_mode=auto, or set trainer.max_restarts=N to restart automatically",
                    e.role,
                    e.rank,
                    e.node,
                ) from None
            print(
                f"[hybridrl] {e}; {where}: restarting the worker groups ({attempt + 1}/{limit}, trainer.max_restarts)", flush=True
            )
            cfg = ckpt.resume_config(cfg, last)
        finally:
            if trainer is not None:
                trainer.run.finish()  # stops the worker processes still alive
    raise AssertionError("unreachable")
