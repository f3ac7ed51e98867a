"""The Ray backend: one Ray actor (`WorkerHost`) per device, worker groups over them.

A host process joins the `torch.distributed` group of its pool (gloo on CPU, NCCL on GPU;
rendezvous at rank 0's node on a free port) and holds one worker object per role of its
pool, built from the unchanged worker classes. A `RayWorkerGroup` is one role on one pool:
`group.method(batch)` splits and gathers by the method's dispatch mode, and
`group.submit("method", batch)` returns at once with a `.get()`, so independent stages
(the critic's and the actor's in split placement) overlap.

Failures: every wait is on all ranks at once, so a dead process is seen as soon as Ray
reports it, even while the live ranks hang in a collective with it; the error names the
role, rank, node and pid (`WorkerDiedError`), and `RayBackend.shutdown` kills the rest.
A stalled process (SIGSTOP, a frozen node) is not dead to Ray: each host sends a heartbeat
every second from a thread to a small `Heartbeats` actor, and a wait that sees a rank it waits
on silent for `trainer.worker_timeout_s` reports it the same way.

Several nodes: a pool's ranks are laid out node by node (`resource_pool.py`), the heartbeat
actor stays on the driver's node (it must outlive any other node), and a lost node is seen in
seconds: Ray reports its actors unreachable, and when a live rank fails first (in a collective
with a dead one), a rank whose heartbeats have stopped is reported as the cause rather than the
live rank's echo of it. A run that asks for more nodes than have joined waits
`trainer.worker_timeout_s` for them (nodes still starting, or a lost node being replaced before
a `trainer.max_restarts` restart).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from datetime import timedelta

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from hybridrl.distributed import host_threads
from hybridrl.distributed.dispatch import collect_outputs, dispatch_mesh, dispatch_mode, split_inputs
from hybridrl.distributed.errors import BackendError, WorkerDiedError
from hybridrl.distributed.hang_dump import dump_stacks_if_asked
from hybridrl.distributed.layout import ParallelLayout, activate, plan_layout
from hybridrl.distributed.resource_pool import PoolSpec, bundle, missing_resources, pool_specs

PG_TIMEOUT_S = 120
HEARTBEAT_S = 1.0


class Heartbeats:
    """A Ray actor (no CPU reserved): when each worker process was last heard from, by pid,
    timed on this actor's clock (the nodes' clocks need not agree)."""

    def __init__(self):
        self.last: dict[int, float] = {}

    def beat(self, pid: int) -> None:
        self.last[pid] = time.monotonic()

    def ready(self) -> bool:
        return True

    def silent_for(self, pids: list[int]) -> dict[int, float]:
        now = time.monotonic()
        return {pid: now - self.last[pid] for pid in pids if pid in self.last}


def _beat_forever(monitor) -> None:
    import threading

    def loop():
        pid = os.getpid()
        while True:
            try:
                monitor.beat.remote(pid)
            except Exception:  # the run is shutting down
                return
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=loop, name="hybridrl-heartbeat", daemon=True).start()


# The driver's view of the heartbeats (one backend per driver process at a time).
_WATCH: dict = {"monitor": None, "timeout_s": None}


class WorkerHost:
    """One process of a pool (a Ray actor): its rank's workers, one per role."""

    def __init__(self, pool: str, rank: int, world: int, device_type: str, seed: int, env: dict, monitor=None, threads=(0, 1)):
        self.pool, self.rank, self.world, self.device_type = pool, rank, world, device_type
        if monitor is not None:
            _beat_forever(monitor)
        self.workers: dict = {}
        # Ray gives an actor with num_gpus=1 exactly one visible GPU: it is cuda:0 here.
        os.environ.update(env, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0")
        dump_stacks_if_asked()  # HYBRIDRL_DUMP_STACKS_S: where a hung rank waits
        if device_type == "cuda":  # before the first CUDA allocation (rollout/native/cache.py)
            from hybridrl.rollout.native.cache import stable_cache_addresses

            stable_cache_addresses()
        import random

        import numpy as np
        import torch

        if device_type == "cuda":
            torch.cuda.set_device(0)
        host_threads.apply(threads[0], device_type, processes_here=threads[1])  # (trainer.cpu_threads, processes on the node)
        # Each rank its own stream (sampling differs per shard); rank 0 = the one-device run's.
        random.seed(seed + rank)
        np.random.seed(seed + rank)
        torch.manual_seed(seed + rank)

    def info(self) -> dict:
        return {
            "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpus": [str(g) for g in ray.get_gpu_ids()],
        }

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def init_process_group(self, addr: str, port: int, timeout_s: float) -> None:
        import torch
        import torch.distributed as dist

        backend = "nccl" if self.device_type == "cuda" else "gloo"
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port))  # for libraries that read them
        kw = {"device_id": torch.device("cuda", 0)} if self.device_type == "cuda" else {}
        dist.init_process_group(
            backend,
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world,
            timeout=timedelta(seconds=timeout_s),
            **kw,
        )

    def add_role(self, role: str, cls, cfg, plan) -> None:
        from hybridrl.config.extensions import load_extensions
        from hybridrl.models.loading import pick_device

        load_extensions(cfg.extensions)  # the user's registered estimators / losses, in this process too
        activate(plan_layout(plan, role))  # the role's ranks as the config lays them out (dp_size, FSDP mesh)
        self.workers[role] = cls(cfg, plan, pick_device(cfg.trainer.device))

    def call(self, role: str, method: str, args: tuple, kwargs: dict):
        _fault_injection_point(method, self.rank)
        return getattr(self.workers[role], method)(*args, **kwargs)

    def run(self, fn, *args):
        """`fn(pool, rank, *args)` in this process (per-rank checkpoint files, tests)."""
        return fn(self.pool, self.rank, *args)


_CALLS: dict[str, int] = {}


def _fault_injection_point(method: str, rank: int) -> None:
    """Tests kill a worker process for real: HYBRIDRL_KILL_WORKER=method:rank:nth:flag_file
    SIGKILLs rank `rank` at its nth call of `method`, once (the flag file marks it done)."""
    spec = os.environ.get("HYBRIDRL_KILL_WORKER")
    if not spec:
        return
    name, kill_rank, nth, flag = spec.split(":", 3)
    _CALLS[method] = _CALLS.get(method, 0) + 1
    if method == name and rank == int(kill_rank) and _CALLS[method] == int(nth) and not os.path.exists(flag):
        with open(flag, "w") as f:
            f.write(f"{os.getpid()} {time.time()}")
        os.kill(os.getpid(), signal.SIGKILL)


class Pending:
    """A submitted group call; `.get()` waits for every rank and gathers the outputs."""

    def __init__(self, group: RayWorkerGroup, refs: list, mode, pad: int, shards: list[int]):
        self.group, self.refs, self.mode, self.pad, self.shards = group, refs, mode, pad, shards

    def get(self):
        return collect_outputs(self.mode, self.group.wait(self.refs), self.pad, self.shards)


class RayWorkerGroup:
    """One role on one pool of hosts; calls are dispatched by the worker class's marks, DP
    methods split over the named dimension of the role's layout."""

    in_process = False  # arguments are sent to the worker processes

    def __init__(self, role: str, cls, hosts: list, infos: list[dict], layout: ParallelLayout | None = None):
        self.role, self.cls, self.hosts, self.infos = role, cls, hosts, infos
        self.layout = layout or ParallelLayout(len(hosts))

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    def submit(self, name: str, *args, **kwargs) -> Pending:
        fn = getattr(self.cls, name, None)
        mode = dispatch_mode(fn)
        if mode is None:
            raise AttributeError(f"{self.cls.__name__}.{name} is not a registered worker method (@register(Dispatch...))")
        shards = self.layout.groups(dispatch_mesh(fn))
        per_args, per_kwargs, pad = split_inputs(mode, shards, args, kwargs)
        refs = [h.call.remote(self.role, name, a, kw) for h, a, kw in zip(self.hosts, per_args, per_kwargs)]
        return Pending(self, refs, mode, pad, shards)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.submit(name, *args, **kwargs).get()

    def wait(self, refs: list) -> list:
        return wait_all(refs, [(self.role, r, info) for r, info in enumerate(self.infos)])


def wait_all(refs: list, who: list[tuple[str, int, dict]]) -> list:
    """Results of `refs` in order; raises at the first failure instead of waiting for every rank.

    A worker exception on one rank often makes the others fail or hang in a collective, so
    the reported error is a process death if one happened (the cause), else the first
    exception raised.
    """
    index = {ref: i for i, ref in enumerate(refs)}
    results, pending = [None] * len(refs), list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=HEARTBEAT_S if _WATCH["monitor"] else None)
        if not ready:
            _check_stalled([who[index[ref]] for ref in pending])
            continue
        try:
            results[index[ready[0]]] = ray.get(ready[0])
        except RayActorError as e:
            raise _died(who[index[ready[0]]], e) from None
        except RayTaskError as e:
            # Give a dead peer a moment to be reported: it is the cause, the rest are echoes.
            done, still = ray.wait(pending, num_returns=len(pending), timeout=3.0) if pending else ([], [])
            for ref in done:
                try:
                    ray.get(ref)
                except RayActorError as dead:
                    raise _died(who[index[ref]], dead) from None
                except RayTaskError:
                    pass
            # Silent through most of that wait, while live processes beat every second: gone.
            _check_silent([who[index[ref]] for ref in still], HEARTBEAT_S * 2, "while another rank failed (lost with its node?)")
            role, rank, info = who[index[ready[0]]]
            cause = e.as_instanceof_cause()  # the worker's exception type, with its traceback text
            if isinstance(e.cause, BaseException) and isinstance(cause, type(e.cause)):
                raise cause from None
            raise RuntimeError(f"{role} rank {rank} on node {info['ip']} failed:\n{e}") from None
    return results


def _check_stalled(waiting: list[tuple[str, int, dict]]) -> None:
    """Raise WorkerDiedError for a rank we wait on that has sent no heartbeat for worker_timeout_s."""
    limit = _WATCH["timeout_s"]
    if limit is not None:
        _check_silent(waiting, limit, f"(trainer.worker_timeout_s={limit:g}); stalled, e.g. SIGSTOP or a frozen node")


def _check_silent(waiting: list[tuple[str, int, dict]], limit: float, why: str) -> None:
    """Raise WorkerDiedError for the rank of `waiting` longest without a heartbeat, if `limit` s or more.

    A process killed with its node (raylet and all) may be reported by Ray only seconds later
    (a failed call to it, or the node's health check); its heartbeats stop at once.
    """
    monitor = _WATCH["monitor"]
    pids = [info["pid"] for _, _, info in waiting if isinstance(info.get("pid"), int)]
    if monitor is None or not pids:
        return
    try:
        silent = ray.get(monitor.silent_for.remote(pids), timeout=30)
    except Exception:
        return  # the monitor is gone (shutdown): the wait itself reports what matters
    # The longest silent rank is the stalled one; the others may only be slowed down waiting on it.
    quiet, who = max(((silent.get(w[2].get("pid"), 0.0), w) for w in waiting), key=lambda x: x[0])
    if quiet >= limit:
        raise _died(who, RuntimeError(f"stopped responding: no heartbeat for {quiet:.0f} s {why}"))


def _died(who: tuple[str, int, dict], error: Exception) -> WorkerDiedError:
    role, rank, info = who
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    node = f"{info['ip']} ({info['host']}, node {info['node_id'][:8]}" if info.get("node_id") else f"{info['ip']} ({info['host']}"
    return WorkerDiedError(
        f"the {role} worker process of rank {rank} on node {node}, pid {info['pid']}) died: {reason}",
        role,
        rank,
        info["ip"],
    )


class RayBackend:
    """The hosts and placement groups of a run, and the worker groups over them."""

    def __init__(self, cfg, plan, roles: dict):
        init_ray(cfg)
        device_type = _device_type(cfg)
        # The driver too: it shares the node's cores with the workers (advantages, batch bookkeeping).
        host_threads.apply(cfg.trainer.cpu_threads, device_type, processes_here=cfg.trainer.n_gpus_per_node)
        self.specs = pool_specs(cfg, list(roles))
        _wait_for_nodes(self.specs, device_type, cfg.trainer.worker_timeout_s)
        self.pgs, self.pools, self.groups = [], {}, {}
        # On the driver's node: heartbeats must outlive any other node, to tell which one was lost.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.monitor = ray.remote(num_cpus=0, max_restarts=0)(Heartbeats).options(scheduling_strategy=here).remote()
        _WATCH.update(monitor=self.monitor, timeout_s=cfg.trainer.worker_timeout_s)
        try:
            self._wait_for_monitor()
            for spec in self.specs:
                self.pools[spec.name] = self._start_pool(spec, cfg, device_type)
            refs, who = [], []
            for spec in self.specs:
                hosts, infos = self.pools[spec.name]
                for role in spec.roles:
                    refs += [h.add_role.remote(role, roles[role], cfg, plan) for h in hosts]
                    who += [(role, r, info) for r, info in enumerate(infos)]
                    self.groups[role] = RayWorkerGroup(role, roles[role], hosts, infos, plan_layout(plan, role))
            wait_all(refs, who)
        except BaseException:
            self.shutdown()
            raise

    def _wait_for_monitor(self) -> None:
        """Before any worker beats: the beats sent to a monitor still starting wait for it and are all
        timed when it starts, so a rank stopped in the meantime would look just heard from."""
        try:
            ray.get(self.monitor.ready.remote(), timeout=PG_TIMEOUT_S)
        except GetTimeoutError:
            raise BackendError(
                f"the heartbeat monitor (a Ray actor on the driver's node) did not start within {PG_TIMEOUT_S} s; "
                "see `ray status` and the Ray logs of this node"
            ) from None

    def _start_pool(self, spec: PoolSpec, cfg, device_type: str) -> tuple[list, list[dict]]:
        # One bundle per node with its per_node devices: the ranks of a node are consecutive, and
        # STRICT_SPREAD keeps two bundles off one node even where one node could hold both.
        strategy = "STRICT_SPREAD" if spec.nnodes > 1 else "STRICT_PACK"
        pg = placement_group([bundle(device_type, spec.per_node)] * spec.nnodes, strategy=strategy)
        self.pgs.append(pg)
        ready, _ = ray.wait([pg.ready()], timeout=PG_TIMEOUT_S)
        if not ready:
            raise BackendError(
                f"Ray could not place {spec.name}: {spec.nnodes} node(s) with {spec.per_node} free "
                f"{'GPU' if device_type == 'cuda' else 'CPU'}s each were not found within {PG_TIMEOUT_S}s "
                "(other jobs on the cluster?); see `ray status`"
            )
        remote = ray.remote(max_restarts=0)(WorkerHost)
        # The driver's HYBRIDRL_* settings reach the workers even on a cluster started elsewhere.
        env = {k: v for k, v in os.environ.items() if k.startswith("HYBRIDRL_")}
        res = {"num_gpus": 1, "num_cpus": 1} if device_type == "cuda" else {"num_cpus": 1}
        threads = (cfg.trainer.cpu_threads, cfg.trainer.n_gpus_per_node)  # every pool's processes share a node's cores
        hosts = [
            remote.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=n), **res
            ).remote(spec.name, n * spec.per_node + i, spec.world, device_type, cfg.trainer.seed, env, self.monitor, threads)
            for n in range(spec.nnodes)
            for i in range(spec.per_node)
        ]
        unknown = {"ip": "?", "host": "?", "pid": "?"}
        infos = wait_all([h.info.remote() for h in hosts], [(spec.name, r, unknown) for r in range(len(hosts))])
        if spec.nnodes > 1:
            print(f"[hybridrl] {spec.name}: {describe_placement(infos)}", flush=True)
        if spec.world > 1:
            addr, port = infos[0]["ip"], ray.get(hosts[0].free_port.remote())
            wait_all(
                [h.init_process_group.remote(addr, port, 600.0) for h in hosts],
                [(spec.name, r, info) for r, info in enumerate(infos)],
            )
        return hosts, infos

    def run_on_hosts(self, fn, *args) -> list:
        """`fn(pool, rank, *args)` on every process of every pool, in pool and rank order."""
        refs, who = [], []
        for name, (hosts, infos) in self.pools.items():
            refs += [h.run.remote(fn, *args) for h in hosts]
            who += [(name, r, info) for r, info in enumerate(infos)]
        return wait_all(refs, who)

    def world_sizes(self) -> dict[str, int]:
        return {name: len(hosts) for name, (hosts, _) in self.pools.items()}

    def pids(self) -> dict[str, list[int]]:
        return {name: [i["pid"] for i in infos] for name, (_, infos) in self.pools.items()}

    def shutdown(self) -> None:
        for hosts, _ in self.pools.values():
            for h in hosts:
                ray.kill(h, no_restart=True)
        for pg in self.pgs:
            remove_placement_group(pg)
        self.pools, self.pgs = {}, []
        if _WATCH["monitor"] is self.monitor:
            _WATCH.update(monitor=None, timeout_s=None)
        if self.monitor is not None:
            ray.kill(self.monitor, no_restart=True)
            self.monitor = None


def describe_placement(infos: list[dict]) -> str:
    """Which ranks run on which node, in one line: `ranks 0-1 on node 3f2a9c1e (10.0.0.1, gpu-1); ...`."""
    nodes: dict[str, list[int]] = {}
    for rank, info in enumerate(infos):
        nodes.setdefault(info["node_id"], []).append(rank)
    parts = []
    for node, ranks in nodes.items():
        info = infos[ranks[0]]
        span = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        pids = ",".join(str(infos[r]["pid"]) for r in ranks)
        parts.append(f"{span} on node {node[:8]} ({info['ip']}, {info['host']}, pids {pids})")
    return f"{len(infos)} process(es) on {len(nodes)} node(s): " + "; ".join(parts)


def _wait_for_nodes(specs: list[PoolSpec], device_type: str, timeout_s: float) -> None:
    """Return once the cluster has the nodes the pools need; BackendError after `timeout_s` (at once
    when fewer devices than one node's share are the problem, which no waiting fixes)."""
    deadline, told = time.monotonic() + timeout_s, False
    while problem := missing_resources(specs, device_type, ray.nodes()):
        if max(s.nnodes for s in specs) == 1 or time.monotonic() > deadline:
            raise BackendError(f"not enough resources on the Ray cluster: {problem}")
        if not told:
            print(f"[hybridrl] waiting up to {timeout_s:g} s (trainer.worker_timeout_s) for Ray nodes: {problem}", flush=True)
            told = True
        time.sleep(1.0)


def _device_type(cfg) -> str:
    if cfg.trainer.device == "auto":
        # The driver may have no GPU while the cluster has: ask the cluster.
        return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"
    return cfg.trainer.device


def init_ray(cfg) -> None:
    """Join the configured cluster, or start a local one on this node (`ray.init` does)."""
    if ray.is_initialized():
        return
    address = cfg.ray_init.address or os.environ.get("RAY_ADDRESS")
    if address:
        try:
            ray.init(**{"log_to_driver": True, **_extra_init_kwargs(cfg), "address": address})
        except (ConnectionError, RuntimeError) as e:
            raise BackendError(
                f"cannot join the Ray cluster at {address} (ray_init.address or RAY_ADDRESS): {e}; start it with "
                "`ray start --head` on the head node (docs/distributed.md), or unset the address for a local cluster"
            ) from None
        return
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    num_cpus = cfg.ray_init.num_cpus or max(os.cpu_count() or 1, world)
    # A local cluster lives and dies with this run: its files in a temp dir of its own (removed
    # at exit, so /tmp/ray/session_* does not pile up), and SIGTERM/SIGHUP stop it like an exit.
    temp_dir = tempfile.mkdtemp(prefix="hybridrl-ray-")
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    ray.init(
        **{
            "include_dashboard": False,
            "log_to_driver": True,
            **_extra_init_kwargs(cfg),
            "num_cpus": num_cpus,
            "_temp_dir": temp_dir,
        }
    )
    atexit.register(_stop_local_ray, temp_dir)
    # ray.init installs its own SIGTERM handlers, and the core worker's (C++) one ends the process
    # with SIGABRT and a stack dump: put back the handler the run had (hybridrl.launch.stop_on_signals
    # raises SignalStop, which unwinds like Ctrl-C), or one that exits with 128 + the signal.
    for sig, handler in before.items():
        signal.signal(sig, _exit_on_signal if handler in (signal.SIG_DFL, None) else handler)


def _extra_init_kwargs(cfg) -> dict:
    """ray_init.kwargs (verl's ray_kwargs.ray_init.*, e.g. runtime_env) passed on to ray.init."""
    return {k: v for k, v in cfg.ray_init.kwargs.items() if k not in ("address", "num_cpus")}


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds: the run's finally blocks, then atexit stops Ray


def _stop_local_ray(temp_dir: str) -> None:
    try:
        ray.shutdown()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
