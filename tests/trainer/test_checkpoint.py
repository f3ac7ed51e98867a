import random

import numpy as np
import torch

from hybridrl.trainer import checkpoint as ckpt


def test_atomic_save_and_latest(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (2, 4):
        tmp = ckpt.begin_save(root, step)
        (tmp / "payload").write_text(str(step))
        ckpt.finish_save(root, tmp, step, {"global_step": step, "data": {"epoch": 0, "position": step}}, keep=None)
    assert ckpt.latest_checkpoint(root).name == "step_4"
    # a crash mid-save leaves only a .tmp directory: it is never taken as a checkpoint
    tmp = ckpt.begin_save(root, 6)
    (tmp / "payload").write_text("half")
    assert ckpt.latest_checkpoint(root).name == "step_4"
    # a stale pointer (directory removed by hand) falls back to the newest complete step
    (root / "latest").write_text("step_8")
    assert ckpt.latest_checkpoint(root).name == "step_4"
    assert ckpt.load_trainer_state(root / "step_4") == {"global_step": 4, "data": {"epoch": 0, "position": 4}}


def test_prune_keeps_newest(tmp_path):
    root = tmp_path / "c"
    for step in (1, 2, 3):
        ckpt.finish_save(root, ckpt.begin_save(root, step), step, {"global_step": step}, keep=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_2", "step_3"]


def test_rng_roundtrip_restores_every_generator(tmp_path):
    ckpt.seed_everything(3)
    root = tmp_path / "c"
    final = ckpt.finish_save(root, ckpt.begin_save(root, 1), 1, {}, keep=None)
    want = (random.random(), np.random.rand(), torch.rand(1).item())
    random.random(), np.random.rand(), torch.rand(1)  # move every generator on
    ckpt.restore_rng(final)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == want
