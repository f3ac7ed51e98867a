"""Several Ray nodes on one machine, for tests of the multi-node path: a head (`ray start --head`)
and worker nodes (`ray start --address=...`), each with its own resources, temp dir and ports.

On a GPU machine, `python tests/distributed/ray_nodes.py --nodes 2 --gpus-per-node 2 -- CMD ...`
starts the nodes (node i sees GPUs i*2 .. i*2+1), runs CMD with `{address}` replaced by the head's
address and the cluster's auth token in its environment, and stops them:

    python tests/distributed/ray_nodes.py --nodes 2 --gpus-per-node 2 -- hybridrl train CONFIG \
        trainer.device=cuda trainer.nnodes=2 trainer.n_gpus_per_node=2 ray_init.address={address}

Only the processes this cluster started are ever stopped: those whose command line names one of
its temp dirs, and their descendants (Ray's worker processes rename themselves `ray::...`), by pid.
Never `ray stop`, which stops every Ray process of the machine, other users' included.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# The head's health check of the other nodes, faster than Ray's default (a few seconds instead of
# about 15) so that a lost node is marked dead within the test's time.
SYSTEM_CONFIG = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(proc.name))
    return kids


def processes_of(temp_dir: str) -> list[int]:
    """The live processes started for a node whose temp dir is `temp_dir`: named on their command
    line, and every descendant of those."""
    roots = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and temp_dir in _cmdline(int(p.name))]
    kids, seen, todo = _children(), set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen and pid != os.getpid():
            seen.add(pid)
            todo += kids.get(pid, [])
    return sorted(seen)


class LocalRayNodes:
    """`nodes[0]` is the head; `start_node(i)`, `kill_node(i)` (SIGKILL, as a lost machine), `stop()`."""

    def __init__(self, nodes: list[dict], timeout_s: float = 60.0):
        """`nodes`: per node, `ray start` options: {"num_cpus": 1, "resources": {"head": 1}}, and
        "gpus": the GPU indices the node sees (CUDA_VISIBLE_DEVICES)."""
        self.specs, self.timeout_s = nodes, timeout_s
        self.root = tempfile.mkdtemp(prefix="hrl-nodes-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dirs: list[str] = []
        base = random.Random(os.getpid() ^ self.port).randrange(20000, 28000, 100)  # not ephemeral (free_port's)
        self.worker_ports = [(base + 1000 * i, base + 1000 * i + 99) for i in range(len(nodes))]
        # Token authentication with a token of this cluster's own (as examples/slurm does): not a
        # ~/.ray/auth_token that another user's cluster on this machine may have written. Drivers
        # of this cluster run with `env`.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))

    def start(self) -> LocalRayNodes:
        try:
            for i in range(len(self.specs)):
                self.start_node(i)  # returns once the node has registered with the head
        except BaseException:
            self.stop()
            raise
        return self

    def start_node(self, i: int) -> None:
        spec, lo_hi = self.specs[i], self.worker_ports[i]
        temp = os.path.join(self.root, f"n{i}_{len(self.dirs)}")  # a restarted node gets a fresh dir
        self.dirs.append(temp)
        args = [
            "ray",
            "start",
            f"--temp-dir={temp}",
            f"--num-cpus={spec.get('num_cpus', 1)}",
            f"--resources={json.dumps(spec.get('resources', {}))}",
            f"--min-worker-port={lo_hi[0]}",
            f"--max-worker-port={lo_hi[1]}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
        ]
        env = dict(self.env)
        if "gpus" in spec:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec["gpus"]))
            args.append(f"--num-gpus={len(spec['gpus'])}")
        if i == 0:
            args += [
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
                f"--system-config={json.dumps(SYSTEM_CONFIG)}",
            ]
        else:
            args += [f"--address={self.address}", "--node-ip-address=127.0.0.1"]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=self.timeout_s, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        self.specs[i] = {**spec, "temp_dir": temp}

    def temp_dir(self, i: int) -> str:
        return self.specs[i]["temp_dir"]

    def alive_nodes(self) -> int:
        script = (
            "import ray; ray.init(address=%r, logging_level='ERROR', log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))" % self.address
        )
        proc = subprocess.run(["python", "-c", script], capture_output=True, text=True, timeout=self.timeout_s, env=self.env)
        return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else -1

    def wait_alive(self, n: int) -> None:
        deadline = time.time() + self.timeout_s
        while (alive := self.alive_nodes()) != n:
            if time.time() > deadline:
                raise RuntimeError(f"{alive} Ray node(s) alive after {self.timeout_s:g} s, expected {n}")
            time.sleep(0.5)

    def kill_node(self, i: int) -> list[int]:
        """SIGKILL every process of node i (raylet, its workers, log monitor): the node is lost."""
        pids = processes_of(self.temp_dir(i))
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def stop(self) -> None:
        """Kill every process this cluster started (worker nodes first), remove its files."""
        for d in reversed(self.dirs):
            for pid in processes_of(d):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 10
        while any(processes_of(d) for d in self.dirs) and time.time() < deadline:
            time.sleep(0.2)
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description="Run CMD on several Ray nodes started on this machine.")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--cpus-per-node", type=int, default=None)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...; {address} is the head's address")
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command to run after --")
    g, cpus = args.gpus_per_node, args.cpus_per_node or max(1, (os.cpu_count() or 1) // args.nodes)
    specs = [{"num_cpus": cpus, **({"gpus": list(range(i * g, (i + 1) * g))} if g else {})} for i in range(args.nodes)]
    cluster = LocalRayNodes(specs)
    try:
        cluster.start()
        print(f"[ray_nodes] {args.nodes} node(s) at {cluster.address} ({cluster.root})", flush=True)
        return subprocess.run([c.replace("{address}", cluster.address) for c in cmd], env=cluster.env).returncode
    finally:
        cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
