"""Pick the backend and build a run's worker groups: in-process for one device, Ray otherwise.

The single-device path imports nothing from Ray (the GPU image has none installed).
"""

from __future__ import annotations

import os

from hybridrl.distributed import host_threads
from hybridrl.distributed.errors import BackendError, WorkerDiedError
from hybridrl.distributed.local import LocalWorkerGroup

__all__ = ["BackendError", "WorkerDiedError", "WorkerGroups", "create_worker_groups", "uses_ray"]


def uses_ray(cfg) -> bool:
    """Ray for more than one device, or when a cluster address is configured."""
    t = cfg.trainer
    return t.nnodes * t.n_gpus_per_node > 1 or bool(cfg.ray_init.address or os.environ.get("RAY_ADDRESS"))


class WorkerGroups:
    """Role name -> worker group, and the processes behind them (`backend`: None in-process)."""

    def __init__(self, groups: dict, backend=None):
        self.groups, self.backend = groups, backend

    def __getitem__(self, role: str):
        return self.groups[role]

    def get(self, role: str):
        return self.groups.get(role)

    def shutdown(self) -> None:
        if self.backend is not None:
            self.backend.shutdown()


def create_worker_groups(cfg, plan, roles: dict) -> WorkerGroups:
    """`roles`: role name (resource_pool.ACTOR, CRITIC) -> worker class `cls(cfg, plan, device)`."""
    if uses_ray(cfg):
        try:
            from hybridrl.distributed.ray_backend import RayBackend
        except ImportError as e:
            t = cfg.trainer
            raise BackendError(
                f"trainer.nnodes x trainer.n_gpus_per_node = {t.nnodes * t.n_gpus_per_node} devices (or a Ray address) "
                f"needs Ray, which cannot be imported ({e}); pip install 'ray>=2.40', or use one device"
            ) from None

        backend = RayBackend(cfg, plan, roles)
        return WorkerGroups(backend.groups, backend)
    from hybridrl.models.loading import pick_device

    device = pick_device(cfg.trainer.device)
    host_threads.apply(cfg.trainer.cpu_threads, device.type, processes_here=1)
    return WorkerGroups({role: LocalWorkerGroup(cls(cfg, plan, device), role) for role, cls in roles.items()})
