"""benchmarks/trace_summary.py: compute, communication and exposed communication per worker method
of a profiled step (issue 40), on a canned GPU-like trace with numbers worked out by hand, and on a
real CPU trace in which a registered worker method is a named range (distributed/dispatch.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridrl.distributed.dispatch import Dispatch, dispatch_mode, register

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "trace_summary.py"


def _load():
    spec = importlib.util.spec_from_file_location("trace_summary", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7}


def _gpu_trace(shift=0.0):
    """update_actor's window is [0, 30] ms: compute [0, 10] and [15, 25], an all-gather over [5, 20];
    a kernel after the window and a CPU range of another name must not count."""
    s = shift
    return [
        _x("user_annotation", "hybridrl/update_actor", s - 2000, 29000),  # the CPU range (not used on a GPU trace)
        _x("gpu_user_annotation", "hybridrl/update_actor", s + 0, 30000),
        _x("kernel", "ampere_bf16_gemm", s + 0, 10000),
        _x("kernel", "ncclDevKernel_AllGather_RING_LL", s + 5000, 15000),
        _x("gpu_memcpy", "Memcpy DtoD", s + 15000, 4000),
        _x("kernel", "triton_fused_rmsnorm", s + 19000, 6000),
        _x("kernel", "ampere_bf16_gemm", s + 40000, 5000),
        _x("user_annotation", "other/range", s + 0, 50000),
    ]


def test_a_gpu_trace_splits_into_compute_comm_exposed_and_idle():
    ts = _load()
    got = ts.summarize_trace(_gpu_trace())
    assert set(got) == {"update_actor"}
    row = got["update_actor"]
    assert row["calls"] == 1
    assert row["wall"] == pytest.approx(30.0)
    assert row["compute"] == pytest.approx(20.0)  # [0, 10] + [15, 25] (memcpy [15, 19], kernel [19, 25])
    assert row["comm"] == pytest.approx(15.0)
    assert row["exposed_comm"] == pytest.approx(5.0)  # [10, 15]: the all-gather with nothing beside it
    assert row["idle"] == pytest.approx(5.0)  # [25, 30]


def test_interval_arithmetic_against_a_brute_force_count():
    ts = _load()
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        xs = [(a, a + d) for a, d in (torch.randint(0, 200, (2,), generator=g).tolist() for _ in range(8))]
        ys = [(a, a + d) for a, d in (torch.randint(0, 200, (2,), generator=g).tolist() for _ in range(8))]
        cover = torch.zeros(500, dtype=torch.bool)
        hide = torch.zeros(500, dtype=torch.bool)
        for a, b in xs:
            cover[a:b] = True
        for a, b in ys:
            hide[a:b] = True
        mx, my = ts.union(xs), ts.union(ys)
        assert ts.length(mx) == int(cover.sum())
        assert ts.length(ts.subtract(mx, my)) == int((cover & ~hide).sum())
        assert ts.length(ts.clip(mx, 100, 300)) == int(cover[100:300].sum())


def test_the_command_reads_every_rank_and_reports_the_slowest(tmp_path):
    step = tmp_path / "step_3"
    step.mkdir()
    (step / "actor_rank0.json").write_text(json.dumps({"traceEvents": _gpu_trace()}))
    slow = _gpu_trace() + [_x("gpu_user_annotation", "hybridrl/update_actor", 100000, 50000)]
    (step / "actor_rank1.json").write_text(json.dumps({"traceEvents": slow}))
    (step / "actor_rank0.txt").write_text("not a trace")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(step), "--json", str(tmp_path / "s.json")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "| actor_rank1 | update_actor | 2 | 80.0 |" in out
    assert "| max of 2 | update_actor | | 80.0 | 20.0 | 15.0 | 5.0 | 55.0 |" in out
    assert "| mean of 2 | update_actor | | 55.0 |" in out
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["actor_rank0"]["update_actor"]["exposed_comm"] == pytest.approx(5.0)


def test_an_empty_step_directory_says_what_to_run(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert r.returncode != 0 and "trainer.profile_steps" in r.stderr


class _Worker:
    @register(Dispatch.ALL)
    def update_actor(self, x):
        """Docstring kept."""
        return (x @ x).sum()


def test_a_registered_method_is_a_named_range_in_a_real_trace(tmp_path):
    from torch.profiler import ProfilerActivity, profile

    w = _Worker()
    assert dispatch_mode(_Worker.update_actor) is Dispatch.ALL
    assert _Worker.update_actor.__doc__ == "Docstring kept." and _Worker.update_actor.__name__ == "update_actor"
    x = torch.randn(64, 64)
    plain = w.update_actor(x)  # no profiler: the same answer, no range
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert torch.equal(w.update_actor(x), plain)
        w.update_actor(x)
    path = tmp_path / "actor_rank0.json"
    prof.export_chrome_trace(str(path))
    row = _load().summarize_dir(tmp_path)["actor_rank0"]["update_actor"]
    assert row["calls"] == 2 and row["wall"] > 0
    assert row["compute"] == 0 and row["comm"] == 0  # a CPU trace has no device kernels


def _h(cat, name, ts, dur, tid=7):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}


def test_host_time_splits_into_python_sync_launch_and_op_self_time():
    """update_actor's CPU range is [0, 100] us on thread 7: aten::cat [10, 40] holds aten::copy_
    [15, 25] and a launch [26, 30]; a stream sync [50, 80]; the rest (30 us) is Python. Spans of
    another thread or outside the window do not count."""
    ts = _load()
    events = [
        _h("user_annotation", "hybridrl/update_actor", 0, 100),
        _h("cpu_op", "aten::cat", 10, 30),
        _h("cpu_op", "aten::copy_", 15, 10),
        _h("cuda_runtime", "cudaLaunchKernel", 26, 4),
        _h("cuda_runtime", "cudaStreamSynchronize", 50, 30),
        _h("cpu_op", "aten::mm", 20, 50, tid=8),  # another thread
        _h("cpu_op", "aten::mm", 120, 10),  # after the window
    ]
    row = ts.summarize_host(events)["update_actor"]
    assert row["wall"] == pytest.approx(0.100)
    assert row["ops"] == pytest.approx(0.016 + 0.010)  # cat's self time (30 - 10 - 4) and copy_'s 10
    assert row["launch"] == pytest.approx(0.004)
    assert row["launches"] == 1
    assert row["sync"] == pytest.approx(0.030)
    assert row["python"] == pytest.approx(0.040)  # 100 - covered [10, 40] and [50, 80]
    assert row["top"] == [("aten::cat", pytest.approx(0.016)), ("aten::copy_", pytest.approx(0.010))]
    assert ts.self_times([_h("cpu_op", "a", 0, 10), _h("cpu_op", "b", 2, 3), _h("cpu_op", "c", 6, 2)])[0][1] == 5.0
