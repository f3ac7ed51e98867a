"""Two Ray nodes on one machine (a head and a worker node, each with its own CPUs, custom
resource, temp dir and ports), and `hybridrl train ... trainer.nnodes=2` across them on gloo:

- the worker group spans the nodes: its two ranks run on different nodes (one bundle of the
  placement group on each), and each writes its own checkpoint files;
- a lost worker node (its raylet and every process of it SIGKILLed mid-run) stops the run within
  seconds with one line naming the rank, the node, the last good checkpoint and how to resume;
  the checkpoint is intact: after a replacement node joins, `trainer.resume_mode=auto` continues
  the run with the metrics of an uninterrupted one;
- with `trainer.max_restarts=1` the run waits for a replacement node and resumes by itself.

About 80 s on the 2-core CI machine (three runs of `hybridrl train`, two node restarts).

Every Ray process the tests start is stopped by pid at the end, whatever happens (ray_nodes.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ray_nodes import LocalRayNodes  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
STEPS, SAVE_FREQ = 12, 3
# Metrics that depend on the wall clock, not on the run's state.
VOLATILE = ("timing_s/", "perf/", "rollout/")


@pytest.fixture(scope="module")
def nodes():
    pytest.importorskip("ray")
    # Two CPUs a node: either node could hold both ranks, so a worker group on both is the placement's doing.
    cluster = LocalRayNodes([{"num_cpus": 2, "resources": {"hrl_head": 1}}, {"num_cpus": 2, "resources": {"hrl_worker": 1}}])
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _argv(nodes, tiny_model_dir, arith_data, out, *overrides) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hybridrl",
        "train",
        str(ROOT / "configs/quickstart.yaml"),
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={arith_data['train']}",
        "data.val_files=null",
        "warmup.steps=0",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        f"ray_init.address={nodes.address}",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={SAVE_FREQ}",
        "trainer.test_freq=-1",
        "trainer.logger=[console,jsonl]",
        f"trainer.default_local_dir={out}",
        *overrides,
    ]


def _run(nodes, argv, timeout=120) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=nodes.env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _metrics(run_dir: Path) -> dict[int, dict]:
    """step -> metrics; a step run again after a restart keeps its last line."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows if r.get("step", 0) > 0}


def _assert_continues(run: dict[int, dict], straight: dict[int, dict], after: int) -> None:
    assert sorted(run) == list(range(1, STEPS + 1))
    for step in range(after + 1, STEPS + 1):
        assert run[step].keys() == straight[step].keys(), step
        for k, v in straight[step].items():
            assert run[step][k] == pytest.approx(v, rel=1e-6, abs=1e-9), (step, k)


def _placement(stdout: str) -> tuple[list[int], list[str]]:
    """The ranks' pids and node ids from the run's line
    `[hybridrl] colocated: 2 process(es) on 2 node(s): rank 0 on node ID (IP, HOST, pids P); rank 1 ...`."""
    line = next(line for line in stdout.splitlines() if line.startswith("[hybridrl] colocated:"))
    assert "2 process(es) on 2 node(s)" in line, line
    return [int(p) for p in re.findall(r"pids (\d+)\)", line)], re.findall(r"on node (\w+)", line)


def _latest_step(run_dir: Path) -> int:
    latest = run_dir / "checkpoints" / "latest"
    return int(latest.read_text().strip().split("_")[1]) if latest.exists() else 0


def _kill_worker_node_after_checkpoint(nodes, argv, run_dir: Path) -> tuple[subprocess.Popen, float, list[int]]:
    """Start the run, SIGKILL the worker node once the run has written a checkpoint of its own."""
    before = _latest_step(run_dir)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=nodes.env)
    deadline = time.time() + 90
    while _latest_step(run_dir) <= before:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    killed = nodes.kill_node(1)
    assert killed, "the worker node had no processes"
    return proc, time.time(), killed


@pytest.fixture(scope="module")
def straight(nodes, tiny_model_dir, arith_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight")
    proc = _run(nodes, _argv(nodes, tiny_model_dir, arith_data, out))
    return out, proc.stdout


def test_worker_group_spans_both_nodes(nodes, straight):
    out, stdout = straight
    pids, node_ids = _placement(stdout)
    assert len(pids) == 2 and len(set(node_ids)) == 2, (pids, node_ids)
    steps = _metrics(out)
    assert sorted(steps) == list(range(1, STEPS + 1))
    rngs = sorted(p.name for p in (out / "checkpoints" / "step_3").glob("rng_*.pt"))
    assert rngs == ["rng_colocated_0.pt", "rng_colocated_1.pt"]  # each node's rank saved its own


def test_lost_worker_node_stops_the_run_resumes_exactly_and_restarts_itself(
    nodes, straight, tiny_model_dir, arith_data, tmp_path
):
    out = tmp_path / "run"
    argv = _argv(nodes, tiny_model_dir, arith_data, out)
    proc, killed_at, killed = _kill_worker_node_after_checkpoint(nodes, argv, out)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    stopped = time.time() - killed_at
    assert proc.returncode == 1, stdout + stderr
    # Seen from outside Ray: one rank was a process of the worker node (killed with it), one was not.
    pids, _ = _placement(stdout)
    (lost,) = [rank for rank, pid in enumerate(pids) if pid in killed]
    assert stopped < 20, f"the controller took {stopped:.0f} s to notice the lost node"
    # One line: the rank, its node, the last good checkpoint, how to resume.
    (line,) = [x for x in stderr.splitlines() if x.startswith("hybridrl train: stopped:")]
    m = re.search(r"the last good checkpoint is (\S+)\. Resume with trainer\.resume_mode=auto", line)
    assert m and f"worker process of rank {lost} on node" in line, line
    last = Path(m.group(1))
    assert last.parent == out / "checkpoints" and (out / "checkpoints" / "latest").read_text().strip() == last.name
    after = int(last.name.split("_")[1])
    assert after >= SAVE_FREQ and after % SAVE_FREQ == 0

    # A replacement node (a fresh temp dir, the same resources) joins; the run resumes from the
    # checkpoint. With trainer.max_restarts=1, losing the worker node again (after the next
    # checkpoint) makes the run wait for another replacement and resume by itself.
    nodes.start_node(1)
    argv += ["trainer.resume_mode=auto", "trainer.max_restarts=1"]
    proc, _, _ = _kill_worker_node_after_checkpoint(nodes, argv, out)
    try:
        nodes.start_node(1)  # e.g. the cluster manager replaces the machine
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 0, stdout + stderr
    assert f"resumed from {last}" in stdout
    m = re.search(r"the last good checkpoint is \S+step_(\d+): restarting the worker groups \(1/1", stdout)
    assert m and int(m.group(1)) > after, stdout
    assert stdout.count("2 process(es) on 2 node(s)") == 2  # the resumed run, then its restart
    _assert_continues(_metrics(out), _metrics(straight[0]), after)
