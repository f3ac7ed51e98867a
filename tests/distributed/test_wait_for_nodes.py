"""A run on several nodes waits `trainer.worker_timeout_s` for missing nodes to join (nodes still
starting, a lost node being replaced), saying so once; then stops naming what is missing. A
shortfall no node can fix (one node, too few devices) stops at once."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")
from hybridrl.distributed import ray_backend  # noqa: E402
from hybridrl.distributed.errors import BackendError  # noqa: E402
from hybridrl.distributed.resource_pool import PoolSpec  # noqa: E402


def _node(ip: str, gpus: int) -> dict:
    return {"Alive": True, "NodeManagerAddress": ip, "Resources": {"GPU": float(gpus), "CPU": 32.0}}


def test_waits_for_a_node_to_join(monkeypatch, capsys):
    joined_at = time.monotonic() + 1.5
    nodes = lambda: [_node("10.0.0.1", 8)] + ([_node("10.0.0.2", 8)] if time.monotonic() > joined_at else [])  # noqa: E731
    monkeypatch.setattr(ray_backend.ray, "nodes", nodes)
    ray_backend._wait_for_nodes([PoolSpec("colocated", ("actor",), 8, 2)], "cuda", timeout_s=30)
    assert time.monotonic() >= joined_at
    out = capsys.readouterr().out
    assert out.count("waiting up to 30 s (trainer.worker_timeout_s) for Ray nodes") == 1, out


def test_stops_after_the_timeout_naming_the_missing_node(monkeypatch):
    monkeypatch.setattr(ray_backend.ray, "nodes", lambda: [_node("10.0.0.1", 8), _node("10.0.0.2", 4)])
    start = time.monotonic()
    with pytest.raises(BackendError, match=r"Missing: 1 node\(s\) with 8 GPUs; start Ray on the missing nodes"):
        ray_backend._wait_for_nodes([PoolSpec("colocated", ("actor",), 8, 2)], "cuda", timeout_s=1.0)
    assert 1.0 <= time.monotonic() - start < 10


def test_one_node_short_of_devices_stops_at_once(monkeypatch):
    monkeypatch.setattr(ray_backend.ray, "nodes", lambda: [_node("10.0.0.1", 4)])
    start = time.monotonic()
    with pytest.raises(BackendError, match="lower trainer.n_gpus_per_node to at most 4"):
        ray_backend._wait_for_nodes([PoolSpec("colocated", ("actor",), 8, 1)], "cuda", timeout_s=60)
    assert time.monotonic() - start < 1
