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


# -- crafted or corrupt files give the one-line CheckpointError, never DCP's CheckpointException ----
def _saved(tmp_path, seed=6):
    cfg, model, opt, sched = _model_and_optim(seed)
    dckpt.save_model(model, tmp_path / "actor", cfg)
    dckpt.save_optimizer(model, opt, sched, tmp_path / "actor")
    return model, opt, sched


def _rewrite_metadata(directory, change):
    meta_file = directory / ".metadata"
    with open(meta_file, "rb") as f:
        meta = pickle.load(f)
    change(meta)
    meta_file.write_bytes(pickle.dumps(meta))


def _refused(fn, match):
    try:
        fn()
    except dckpt.CheckpointError as e:
        assert "is not a valid checkpoint" in str(e) and "\n" not in str(e), str(e)
        assert match in str(e), str(e)
        return
    except BaseException as e:  # torch's CheckpointException is not an Exception
        raise AssertionError(f"{type(e).__name__} escaped, not a CheckpointError: {str(e)[:300]}") from None
    raise AssertionError("the corrupt checkpoint loaded")


@pytest.mark.parametrize(
    "field,value,match",
    [("offset", -100, "invalid offset"), ("length", 2**62, "places an entry"), ("offset", 2**40, "places an entry")],
)
def test_metadata_offsets_outside_the_shard_are_refused(tmp_path, field, value, match):
    model, _, _ = _saved(tmp_path)

    def change(meta):
        for info in meta.storage_data.values():
            setattr(info, field, value)

    _rewrite_metadata(tmp_path / "actor" / "model", change)
    _refused(lambda: dckpt.load_model(model, tmp_path / "actor"), match)


def test_metadata_declaring_huge_tensors_is_refused_before_allocating(tmp_path):
    model, _, _ = _saved(tmp_path)

    def change(meta):
        meta.state_dict_metadata["model.embed_tokens.weight"].size = torch.Size([2**33, 16])

    _rewrite_metadata(tmp_path / "actor" / "model", change)
    _refused(lambda: dckpt.load_model(model, tmp_path / "actor"), "more than its shards hold")


def test_a_shard_that_is_a_pickle_runs_nothing(tmp_path):
    model, _, _ = _saved(tmp_path)
    marker = tmp_path / "pwned"
    for shard in (tmp_path / "actor" / "model").glob("*.distcp"):
        size = shard.stat().st_size
        payload = pickle.dumps(_CreatesFile(marker))
        shard.write_bytes(payload + b"\0" * (size - len(payload)))  # same size: the offsets still fit
    _refused(lambda: dckpt.load_model(model, tmp_path / "actor"), "")
    assert not marker.exists()


def test_a_shard_that_is_a_symlink_is_refused(tmp_path):
    model, _, _ = _saved(tmp_path)
    other = tmp_path / "elsewhere.distcp"
    for shard in (tmp_path / "actor" / "model").glob("*.distcp"):
        other.write_bytes(shard.read_bytes())  # a valid shard, but outside the checkpoint
        shard.unlink()
        shard.symlink_to(other)
    _refused(lambda: dckpt.load_model(model, tmp_path / "actor"), "symbolic link")


def test_a_pickle_in_param_groups_is_refused_through_load_optimizer(tmp_path):
    model, opt, sched = _saved(tmp_path)
    marker = tmp_path / "pwned"
    optim = tmp_path / "actor" / "optim"
    shard = next(optim.glob("*.distcp"))
    payload = pickle.dumps(_CreatesFile(marker))
    start = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload)

    def change(meta):
        for index, info in meta.storage_data.items():
            if "param_groups" in index.fqn and index.fqn.endswith(".lr"):
                info.offset, info.length = start, len(payload)

    _rewrite_metadata(optim, change)
    _refused(lambda: dckpt.load_optimizer(model, opt, sched, tmp_path / "actor"), "param_groups")
    assert not marker.exists()


@pytest.mark.parametrize("content", [{"python": 5}, {"python": [3, [1, 2], None]}, [1, 2], {}])
def test_a_malformed_rng_file_is_a_checkpoint_error(tmp_path, content):
    step = ckpt.finish_save(tmp_path / "c", ckpt.begin_save(tmp_path / "c", 1), 1, {"global_step": 1}, keep=None)
    torch.save(content, step / "rng.pt")
    state = torch.get_rng_state()
    _refused(lambda: ckpt.restore_rng(step), "rng.pt")
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    "content",
    [
        '{"global_step": "x", "data": {"epoch": 0, "position": 0}}',
        '{"global_step": 1}',
        '{"global_step": 1, "data": {"epoch": []}}',
        '{"global_step": -3, "data": {"epoch": 0, "position": 0}}',
        '{"global_step": 1, "data": {"epoch": 0, "position": 0}, "kl_ctrl": 7}',
    ],
)
def test_a_malformed_trainer_state_is_a_checkpoint_error(tmp_path, content):
    step = ckpt.finish_save(tmp_path / "c", ckpt.begin_save(tmp_path / "c", 1), 1, {"global_step": 1}, keep=None)
    (step / "trainer_state.json").write_text(content)
    _refused(lambda: ckpt.load_trainer_state(step), "trainer_state.json")


def test_a_config_unlike_the_weights_is_refused_by_export(tmp_path):
    import json

    _saved(tmp_path)
    config = json.loads((tmp_path / "actor" / "config.json").read_text())
    config["vocab_size"] = 2**33
    (tmp_path / "actor" / "config.json").write_text(json.dumps(config))
    _refused(lambda: dckpt.export_hf(tmp_path / "actor", tmp_path / "hf"), "(8589934592, 16)")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("pointer", ["/etc", "../../elsewhere", "step_1/../..", "step_x"])
def test_latest_must_name_a_step_dir_inside_checkpoints(tmp_path, pointer):
    root = tmp_path / "run" / "checkpoints"
    ckpt.finish_save(root, ckpt.begin_save(root, 1), 1, {"global_step": 1}, keep=None)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "trainer_state.json").write_text("{}")
    (root / ckpt.LATEST).write_text(pointer)
    with pytest.raises(dckpt.CheckpointError, match="not the name of a step_N directory"):
        ckpt.latest_checkpoint(root)
    (root / ckpt.LATEST).write_text("step_1")
    assert ckpt.latest_checkpoint(root) == root / "step_1"


def test_export_refuses_a_link_out_of_the_checkpoint(tmp_path):
    from transformers import PreTrainedTokenizerFast

    _saved(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("{{ 'the host secret' }}")
    (tmp_path / "actor" / "chat_template.jinja").symlink_to(secret)
    del PreTrainedTokenizerFast
    _refused(lambda: dckpt.export_hf(tmp_path / "actor", tmp_path / "hf"), "chat_template.jinja is a link to")
    assert not (tmp_path / "hf").exists()


def test_resume_checks_the_role_configs_first(tmp_path):
    import json

    _saved(tmp_path)
    step = tmp_path
    (step / "trainer_state.json").write_text(json.dumps({"global_step": 1, "data": {"epoch": 0, "position": 4}}))
    torch.save(ckpt.rng_state(), step / "rng.pt")
    assert ckpt.check_resumable(step) == step
    config = json.loads((step / "actor" / "config.json").read_text())
    config["vocab_size"] = 2**33
    (step / "actor" / "config.json").write_text(json.dumps(config))
    _refused(lambda: ckpt.check_resumable(step), "config.json")


# -- crafted checkpoints: one CheckpointError line from resume (check_resumable) and from export
#    (hybridrl export, and hybridrl eval, which exports first), never a traceback or a hang ------
def _step(tmp_path):
    """A complete step directory: the actor (weights, optimizer, scheduler, a tokenizer), trainer
    state and RNG states."""
    import json

    from hybridrl.models.tiny import build_tokenizer

    _saved(tmp_path)
    build_tokenizer().save_pretrained(tmp_path / "actor")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 1, "data": {"epoch": 0, "position": 4}}))
    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    assert ckpt.check_resumable(tmp_path) == tmp_path
    return tmp_path


def _config(step, **changes):
    import json

    file = step / "actor" / "config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def _fifo(path):
    import os

    path.unlink()
    os.mkfifo(path)


CRAFTED = {
    "deep_trainer_state": (lambda s: (s / "trainer_state.json").write_text("[" * 100_000 + "]" * 100_000), "nested too deep"),
    "huge_int_trainer_state": (lambda s: (s / "trainer_state.json").write_text('{"global_step": 1' + "0" * 5000 + "}"), "digits"),
    "unknown_model_type": (lambda s: _config(s, model_type="no_such_model"), "does not build a model"),
    "config_json_a_directory": (
        lambda s: ((s / "actor" / "config.json").unlink(), (s / "actor" / "config.json").mkdir()),
        "config.json is missing or not a file",
    ),
    "zero_layers": (lambda s: _config(s, num_hidden_layers=0), "num_hidden_layers"),
    "zero_layers_and_types": (lambda s: _config(s, num_hidden_layers=0, layer_types=[]), "num_hidden_layers is 0"),
    "scheduler_wrong_types": (
        lambda s: torch.save({"last_epoch": "x", "base_lrs": [1e-3], "_step_count": [1]}, s / "actor" / "scheduler.pt"),
        "scheduler.pt is not a valid checkpoint file: _step_count is '[1]', not a count",
    ),
    "scheduler_not_a_scheduler": (lambda s: torch.save([1, 2], s / "actor" / "scheduler.pt"), "holds a list"),
    "scheduler_junk": (lambda s: (s / "actor" / "scheduler.pt").write_bytes(b"junk"), "scheduler.pt is not a valid checkpoint"),
    "fifo_metadata": (lambda s: _fifo(s / "actor" / "model" / ".metadata"), "model/.metadata is a FIFO, not a file"),
    "fifo_rng": (lambda s: _fifo(s / "rng.pt"), "rng.pt is a FIFO, not a file"),
    "fifo_trainer_state": (lambda s: _fifo(s / "trainer_state.json"), "trainer_state.json is a FIFO, not a file"),
    "device_config": (
        lambda s: ((s / "actor" / "config.json").unlink(), (s / "actor" / "config.json").symlink_to("/dev/zero")),
        "config.json is a link to /dev/zero, outside it",
    ),
}
EXPORT_TOO = {
    "unknown_model_type",
    "config_json_a_directory",
    "zero_layers",
    "zero_layers_and_types",
    "fifo_metadata",
    "device_config",
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_a_crafted_checkpoint_is_one_line_from_resume_and_export(tmp_path, case):
    step = _step(tmp_path)
    craft, match = CRAFTED[case]
    craft(step)
    _refused(lambda: ckpt.check_resumable(step), match)
    if case in EXPORT_TOO:  # what export and eval read
        _refused(lambda: dckpt.export_hf(step / "actor", tmp_path / "hf"), match)


def test_a_tokenizer_that_does_not_load_is_refused_by_export(tmp_path):
    step = _step(tmp_path)
    (step / "actor" / "tokenizer.json").write_text("not json {")
    _refused(lambda: dckpt.export_hf(step / "actor", tmp_path / "hf"), "its tokenizer does not load")


def test_weights_of_more_layers_than_the_config_builds_are_refused(tmp_path):
    """A config.json cut to fewer layers than the saved weights would load a model missing layers."""
    two = tiny_qwen2(48, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    dckpt.save_model(two, tmp_path / "actor", two.config)
    _config(tmp_path, num_hidden_layers=1, layer_types=["full_attention"])
    _refused(lambda: dckpt.export_hf(tmp_path / "actor", tmp_path / "hf"), "builds 1 layers, but the saved weights hold 2")


def test_a_fifo_latest_pointer_is_one_line(tmp_path):
    import os

    root = tmp_path / "checkpoints"
    ckpt.finish_save(root, ckpt.begin_save(root, 1), 1, {"global_step": 1}, keep=None)
    (root / ckpt.LATEST).unlink()
    os.mkfifo(root / ckpt.LATEST)
    with pytest.raises(dckpt.CheckpointError, match="latest cannot be read .*a FIFO, not a file"):
        ckpt.latest_checkpoint(root)


class _StopsWhilePickled:
    """A signal landing while DCP writes: SIGTERM raises SignalStop in the middle of a write."""

    def __reduce__(self):
        from hybridrl.launch import SignalStop

        raise SignalStop(15)


@pytest.mark.parametrize("stop", ["signal", "ctrl-c"])
def test_a_stop_during_a_save_or_load_is_raised_as_itself_not_as_a_broken_checkpoint(tmp_path, stop):
    # DCP wraps whatever a rank raises in a CheckpointException; a Ctrl-C or SIGTERM must still end
    # the run as a stop (exit 130/143, "stopped by SIGTERM"), not as an error.
    from hybridrl.launch import SignalStop

    bomb = _StopsWhilePickled() if stop == "signal" else _InterruptsWhilePickled()
    with pytest.raises(KeyboardInterrupt) as raised:
        dckpt._save({"w": torch.randn(3), "extra": bomb}, tmp_path / "ck")
    assert isinstance(raised.value, SignalStop) == (stop == "signal")
    assert type(raised.value).__name__ != "CheckpointException"
    dckpt._save({"w": torch.randn(3)}, tmp_path / "ok")
    before = torch.distributed.checkpoint.load

    def interrupted(*a, **k):
        raise torch.distributed.checkpoint.api.CheckpointException("x", {0: (KeyboardInterrupt(), None)})

    torch.distributed.checkpoint.load = interrupted  # DCP's own wrapping of a Ctrl-C while reading
    try:
        with pytest.raises(KeyboardInterrupt):
            dckpt._load({"w": torch.empty(3)}, tmp_path / "ok")
    finally:
        torch.distributed.checkpoint.load = before


class _InterruptsWhilePickled:
    def __reduce__(self):
        raise KeyboardInterrupt
