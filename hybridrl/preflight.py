"""What is checked before a run writes anything or loads a model: how it was started, and whether the
optional packages its config names are installed. Each problem is one line (exit 2 from the CLI,
`HybridRLError` from the Python API), and a refused start leaves no file behind, so the same
command runs once the problem is fixed.

Launchers. hybridrl is one controller process that starts one worker per device itself (Ray on
several GPUs, docs/distributed.md). `torchrun --nproc_per_node=2 hybridrl train ...` (or
`accelerate launch`, `srun --ntasks=2`, `mpirun -n 2`) would start two controllers, each training
the whole model into the same run directory. Every rank refuses, rank 0 too: rank 0 running while
the others exit would be torn down by torchrun and accelerate as soon as a sibling exits non-zero,
and a rank cannot tell whether its siblings will run. One process per node is fine
(`WORLD_SIZE=1`, a single Slurm task, as the sbatch example starts it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping

# (launcher, its world-size variable, its rank variable), in the order they are recognised.
LAUNCHERS = (
    ("torchrun/accelerate", "WORLD_SIZE", "RANK"),
    # SLURM_STEP_NUM_TASKS, not SLURM_NTASKS: an sbatch script's own shell sees the allocation's task
    # count, and starting hybridrl once there is right (examples/slurm/hybridrl.sbatch); srun's tasks see their step's
    ("Slurm (srun)", "SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
    ("MPI (mpirun)", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("MPI (mpirun)", "PMI_SIZE", "PMI_RANK"),
)

# trainer.logger names -> (module, what to install)
LOGGER_PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"), "swanlab": ("swanlab", "swanlab")}


def launcher_refusal(environ: Mapping[str, str] | None = None) -> str | None:
    """The one line refusing a start as one of several ranks of a launcher, or None.

    >>> launcher_refusal({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})[:74]
    'started by torchrun/accelerate as rank 1 of 2: hybridrl is one process tha'
    >>> launcher_refusal({"WORLD_SIZE": "1", "RANK": "0"}) is None
    True
    """
    env = os.environ if environ is None else environ
    for name, size_var, rank_var in LAUNCHERS:
        try:
            size = int(env.get(size_var, "1") or 1)
        except ValueError:
            continue
        if size > 1:
            rank = env.get(rank_var, "?")
            return (
                f"started by {name} as rank {rank} of {size}: hybridrl is one process that starts one worker per "
                f"GPU itself, so {size} copies would each train the whole run into one folder; start it once, "
                f"without the launcher, and give the devices in the config: hybridrl train CONFIG "
                f"trainer.n_gpus_per_node=N [trainer.nnodes=M] (several nodes: docs/distributed.md)"
            )
    return None


def backend_problems(cfg) -> list[str]:
    """Optional packages the config needs that are not installed, one line each with the pip command."""
    problems = []
    loggers = cfg.trainer.logger
    for name in [loggers] if isinstance(loggers, str) else list(loggers or []):
        module, package = LOGGER_PACKAGES.get(name, (None, None))
        if module and not installed(module):
            kept = [x for x in loggers if x not in LOGGER_PACKAGES or installed(LOGGER_PACKAGES[x][0])]
            problems.append(
                f"trainer.logger includes {name!r}, which is not installed: pip install {package}, or drop it: "
                f"trainer.logger=[{','.join(kept) or 'console'}]"
            )
    if _uses_ray(cfg) and not installed("ray"):
        t = cfg.trainer
        problems.append(
            f"trainer.nnodes={t.nnodes} x trainer.n_gpus_per_node={t.n_gpus_per_node} devices (or a Ray address) need "
            f"Ray, which is not installed: pip install 'hybridrl[ray]' (one device runs without it)"
        )
    return problems


def installed(module: str) -> bool:
    """Whether `import module` can find it (a module blocked with sys.modules[name] = None is not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _uses_ray(cfg) -> bool:
    from hybridrl.distributed.groups import uses_ray

    return uses_ray(cfg)
