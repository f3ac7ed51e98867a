"""Loading a checkpoint never runs code: DCP metadata and non-tensor entries are read with
allow-lists (hybridrl/distributed/checkpoint.py)."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from tiny_models import tiny_qwen2

from hybridrl.distributed import checkpoint as dckpt
from hybridrl.trainer import checkpoint as ckpt


class _CreatesFile:
    """Unpickling this calls open(path, "w"): the payload of a crafted checkpoint."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _model_and_optim(seed: int):
    model = tiny_qwen2(
        48, seed=seed, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
    )
    cfg = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    ids = torch.randint(0, 48, (2, 5))
    model(ids, labels=ids).loss.backward()
    opt.step()
    return cfg, model, opt, sched


def test_saved_checkpoint_loads_through_the_allow_lists(tmp_path):
    cfg, model, opt, sched = _model_and_optim(1)
    dckpt.save_model(model, tmp_path / "actor", cfg)
    dckpt.save_optimizer(model, opt, sched, tmp_path / "actor")
    _, fresh, fresh_opt, fresh_sched = _model_and_optim(2)
    dckpt.load_model(fresh, tmp_path / "actor")
    dckpt.load_optimizer(fresh, fresh_opt, fresh_sched, tmp_path / "actor")
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    assert fresh_opt.param_groups[0]["betas"] == (0.8, 0.95) and fresh_opt.param_groups[0]["lr"] == 1e-3 * 0.5
    p = next(model.parameters())
    q = next(fresh.parameters())
    assert torch.equal(opt.state[p]["exp_avg_sq"], fresh_opt.state[q]["exp_avg_sq"])


@pytest.mark.parametrize("where", ["top", "nested"])
def test_crafted_metadata_is_refused_and_runs_nothing(tmp_path, where):
    cfg, model, opt, sched = _model_and_optim(3)
    dckpt.save_model(model, tmp_path / "actor", cfg)
    marker = tmp_path / "pwned"
    meta_file = tmp_path / "actor" / "model" / ".metadata"
    if where == "top":
        payload = pickle.dumps(_CreatesFile(marker))
    else:  # a genuine Metadata with the payload hidden in one field
        with open(meta_file, "rb") as f:
            meta = pickle.load(f)
        meta.storage_meta.modules = [_CreatesFile(marker)]
        payload = pickle.dumps(meta)
    meta_file.write_bytes(payload)
    with pytest.raises(dckpt.CheckpointError, match=r"is not a valid checkpoint: .*open, which is not checkpoint metadata"):
        dckpt.load_model(model, tmp_path / "actor")
    assert not marker.exists()


def test_shard_path_outside_the_directory_is_refused(tmp_path):
    cfg, model, _, _ = _model_and_optim(4)
    dckpt.save_model(model, tmp_path / "actor", cfg)
    meta_file = tmp_path / "actor" / "model" / ".metadata"
    with open(meta_file, "rb") as f:
        meta = pickle.load(f)
    for info in meta.storage_data.values():
        info.relative_path = "../../elsewhere.distcp"
    meta_file.write_bytes(pickle.dumps(meta))
    with pytest.raises(dckpt.CheckpointError, match="outside its directory"):
        dckpt.load_model(model, tmp_path / "actor")


def test_truncated_metadata_is_a_checkpoint_error(tmp_path):
    cfg, model, _, _ = _model_and_optim(5)
    dckpt.save_model(model, tmp_path / "actor", cfg)
    meta_file = tmp_path / "actor" / "model" / ".metadata"
    meta_file.write_bytes(meta_file.read_bytes()[:100])
    with pytest.raises(dckpt.CheckpointError, match="cannot be read"):
        dckpt.load_model(model, tmp_path / "actor")


def test_crafted_non_tensor_entry_is_refused(tmp_path):
    """DCP's default planner reads param_groups with weights_only=False; ours does not."""
    marker = tmp_path / "pwned"
    planner = dckpt.SafeLoadPlanner()

    class Item:
        class dest_index:
            fqn = "param_groups.0.lr"

    with pytest.raises(dckpt.CheckpointError, match="param_groups.0.lr"):
        planner.load_bytes(Item, io.BytesIO(pickle.dumps(_CreatesFile(marker))))
    assert not marker.exists()


def test_crafted_rng_and_trainer_state_files_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    step = ckpt.finish_save(tmp_path / "c", ckpt.begin_save(tmp_path / "c", 1), 1, {"global_step": 1}, keep=None)
    (step / "rng.pt").write_bytes(pickle.dumps(_CreatesFile(marker)))
    with pytest.raises(dckpt.CheckpointError, match=r"rng.pt is not a valid checkpoint file"):
        ckpt.restore_rng(step)
    assert not marker.exists()
    (step / "trainer_state.json").write_text('{"global_step": 1')
    with pytest.raises(dckpt.CheckpointError, match=r"trainer_state.json is not a valid checkpoint file"):
        ckpt.load_trainer_state(step)
