"""When one rank fails while a peer of its group has gone silent (no heartbeat: its process or its
whole node is gone, and Ray has not said so yet), the silent peer is reported as the cause, a
WorkerDiedError that `trainer.max_restarts` restarts from, not the failing rank's echo of it."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch.distributed as dist

from hybridrl.config import config_from_dict, plan_batches
from hybridrl.distributed.dispatch import Dispatch, register
from hybridrl.distributed.groups import WorkerDiedError

pytestmark = pytest.mark.slow


class Pair:
    """A toy worker: its pid; rank 0 fails (a peer it needed went away, as gloo reports it)."""

    def __init__(self, cfg, plan, device):
        pass

    @register(Dispatch.ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ALL)
    def fail_on_rank0(self) -> None:
        if dist.get_rank() == 0:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:12345")


def _slow_monitor(start_s: float):
    """The heartbeat monitor, starting as slowly as on a loaded node (seen in CI: 7 s)."""
    from hybridrl.distributed.ray_backend import Heartbeats

    class SlowMonitor(Heartbeats):
        def __init__(self):
            time.sleep(start_s)
            super().__init__()

    return SlowMonitor


def test_a_silent_peer_is_reported_as_the_cause_of_a_ranks_failure(ray_session, tiny_model_dir, arith_data, monkeypatch):
    """The monitor starts after the workers could (a loaded node): the backend waits for it before
    starting them, else their first beats queue until it starts and all look fresh then, a rank
    stopped meanwhile too."""
    from ray import cloudpickle

    from hybridrl.distributed import ray_backend
    from hybridrl.distributed.ray_backend import RayBackend

    cloudpickle.register_pickle_by_value(__import__(__name__))  # the toy worker and the slow monitor travel by value
    monkeypatch.setattr(ray_backend, "Heartbeats", _slow_monitor(8.0))
    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir}, "actor": {"ppo_mini_batch_size": 4}},
            # far above the test's time: only the failure of rank 0 can end the wait early
            "trainer": {"device": "cpu", "n_gpus_per_node": 2, "worker_timeout_s": 120.0},
        }
    )
    backend = RayBackend(cfg, plan_batches(cfg), {"pair": Pair})
    try:
        group = backend.groups["pair"]
        pids = group.pid()
        os.kill(pids[1], signal.SIGSTOP)  # silent, and alive to Ray: as a rank of a node lost a moment ago
        start = time.time()
        with pytest.raises(WorkerDiedError) as err:
            group.fail_on_rank0()
        assert time.time() - start < 30
        msg = str(err.value)
        assert "rank 1 on node" in msg and f"pid {pids[1]}" in msg and "no heartbeat" in msg, msg
        assert err.value.rank == 1
    finally:
        backend.shutdown()  # SIGKILL reaches a stopped process


def test_a_restart_that_finds_too_few_nodes_names_the_checkpoint(arith_data, tiny_model_dir, tmp_path):
    """trainer.max_restarts after a lost node: a restart whose nodes never came back stops with
    the cluster's shortfall, the last good checkpoint and how to resume."""
    from hybridrl.distributed.groups import BackendError
    from hybridrl.trainer.setup import checkpoints_dir
    from hybridrl.trainer.supervise import fit_with_restarts

    cfg = config_from_dict(
        {
            "data": {"train_files": arith_data["train"], "train_batch_size": 4},
            "actor_rollout_ref": {"model": {"path": tiny_model_dir}, "actor": {"ppo_mini_batch_size": 4}},
            "trainer": {"device": "cpu", "max_restarts": 2, "default_local_dir": str(tmp_path)},
        }
    )
    step = checkpoints_dir(cfg) / "step_3"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text("{}")
    (checkpoints_dir(cfg) / "latest").write_text("step_3")

    class Run:
        started = 0.0

        def finish(self):
            pass

    class LosesANode:
        run = Run()

        def fit(self):
            raise WorkerDiedError("the actor_rollout_ref worker process of rank 1 ... died", "actor_rollout_ref", 1, "10.0.0.2")

    launches = []

    def make_trainer(cfg):
        launches.append(cfg.trainer.resume_from_path)
        if len(launches) == 1:
            return LosesANode()
        raise BackendError("not enough resources on the Ray cluster: ... Missing: 1 node(s) with 8 GPUs")

    with pytest.raises(BackendError) as err:
        fit_with_restarts(cfg, make_trainer)
    assert str(err.value) == (
        f"not enough resources on the Ray cluster: ... Missing: 1 node(s) with 8 GPUs; the last good checkpoint "
        f"is {step}. Resume with trainer.resume_mode=auto"
    )
    assert launches == [None, str(step)]  # one restart tried, from the checkpoint; no retry without nodes
