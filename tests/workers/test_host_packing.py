"""The packed layout computed on the host (`pack_on_host`) before a micro-batch goes to the device:
every forward takes it instead of packing again, and the passes give exactly what packing in the
forward gives (the code before it), for the update and the log-prob passes, shared prompts on."""

import sys
import tempfile
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from hybridrl.data import keys as K
from hybridrl.models.tiny import write_tiny_model_dir
from hybridrl.workers import engine as engine_module
from hybridrl.workers import forward

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from shared_prompts import grpo_batch, make_worker  # noqa: E402
from update import ARCH  # noqa: E402

SETTINGS = Namespace(prompts=4, n=4, mini=2, prompt_range=(4, 12), response_range=(2, 10), update_budget=64, logprob_budget=96)


def _plain_copy(engine, micro, device):  # the code before: the forward packs the device's copy
    return micro.to(device)


@pytest.fixture(scope="module")
def model_dir():
    return str(write_tiny_model_dir(tempfile.mkdtemp(), **ARCH["tiny"]))


def _run(model_dir, batch, monkeypatch, on_host: bool):
    calls = {"pack": 0}
    real_pack = forward.pack

    def counting_pack(*args, **kwargs):
        calls["pack"] += 1
        return real_pack(*args, **kwargs)

    monkeypatch.setattr(forward, "pack", counting_pack)
    monkeypatch.setattr(engine_module, "pack_on_host", forward.pack_on_host if on_host else _plain_copy)
    w = make_worker(model_dir, SETTINGS, torch.device("cpu"))
    assert w.engine.share_prompts  # the default: GRPO groups share their prompt
    before = w.compute_log_prob(batch.select(list(batch.tensors)))[K.OLD_LOG_PROBS]
    ref = w.compute_ref_log_prob(batch.select(list(batch.tensors)))[K.REF_LOG_PROBS]
    metrics = w.update_actor(batch.select(list(batch.tensors)))
    after = w.compute_log_prob(batch.select(list(batch.tensors)))[K.OLD_LOG_PROBS]
    return calls["pack"], before, ref, metrics, after


def test_passes_packed_on_the_host_equal_packing_in_the_forward(model_dir, monkeypatch):
    batch = grpo_batch(SETTINGS.prompts, SETTINGS.n, SETTINGS.prompt_range, SETTINGS.response_range, 128, seed=3)
    host = _run(model_dir, batch, monkeypatch, on_host=True)
    device = _run(model_dir, batch, monkeypatch, on_host=False)
    assert host[0] == device[0] > 3  # one packing per micro-batch either way: the forward did not pack again
    for a, b in zip(host[1:3] + host[4:], device[1:3] + device[4:]):
        assert torch.equal(a, b)
    assert not torch.equal(host[1], host[4])  # the update moved the weights
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/shared_prompt_fraction"):
        assert host[3][key] == device[3][key], key
    assert host[3]["actor/shared_prompt_fraction"] > 0


def test_a_layout_for_other_settings_is_not_used(model_dir):
    w = make_worker(model_dir, SETTINGS, torch.device("cpu"))
    batch = grpo_batch(2, 3, (4, 8), (2, 6), 128, seed=1)
    micro = forward.pack_on_host(w.engine, batch, torch.device("cpu"))
    (key, shared), packed = micro.meta[forward.PACKED]
    assert key == K.RESPONSES and shared and packed.prompt_gather is not None
    assert forward._pack(w.engine, micro, K.RESPONSES) is packed
    w.engine.share_prompts = False  # the engine no longer shares: the forward packs its own layout
    unshared = forward._pack(w.engine, micro, K.RESPONSES)
    assert unshared is not packed and unshared.prompt_gather is None and unshared.num_tokens > packed.num_tokens


def test_profile_passes_benchmark_smoke(tmp_path):
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "benchmarks/profile_passes.py", "--tiny", "--compare-packing", "--count-syncs", "--out", str(tmp_path)]
    subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=300)
    (row,) = json.loads((tmp_path / "profile_passes.json").read_text())["rows"]
    assert set(row["passes"]) == {"update_actor", "old_log_prob", "ref"}
    assert all(v["median_s"] > 0 and v["profile"]["wall_s"] > 0 for v in row["passes"].values())
    compared = row["packing_on_host_vs_device"]
    assert compared["max_abs_log_prob_diff"] == 0.0
    assert all(compared[p]["host"] > 0 and compared[p]["device"] > 0 for p in row["passes"])
    assert row["update_by_budget"]["128"] > 0 and row["model"] == "tiny"


def _bench(script: str, tmp_path, name: str) -> dict:
    import json
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--tiny", "--out", str(tmp_path)], cwd=root, env=env, check=True, timeout=300
    )
    return json.loads((tmp_path / name).read_text())


def test_residual_dtype_benchmark_smoke(tmp_path):
    """benchmarks/lab/residual_dtype.py --tiny: both layouts timed for each pass; the bf16 residual
    moves the log-probs by bf16 rounding, neither nothing nor more."""
    (row,) = _bench("lab/residual_dtype.py", tmp_path, "residual_dtype.json")["rows"]
    assert 0 < row["mean_abs_log_prob_diff"] <= row["max_abs_log_prob_diff"] < 0.1
    for p in ("update_actor", "old_log_prob", "ref"):
        assert row[p]["median_s"]["fp32"] > 0 and row[p]["median_s"]["bf16"] > 0


def test_update_peak_benchmark_smoke():
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "benchmarks/lab/update_peak.py", "tiny-run", "--tiny"]
    out = subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, text=True, timeout=300).stdout
    name, _, _, seconds, _, _, peak = out.split()[-7:]
    assert name == "tiny-run" and float(seconds) > 0 and float(peak) == 0.0  # CPU: no GPU memory to report
