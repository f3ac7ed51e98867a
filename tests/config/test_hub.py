"""Hub model ids (hybridrl/config/hub.py): refused by default with the installed client's real download
command; with --allow-hub (HYBRIDRL_ALLOW_HUB=1) downloaded once before anything loads, the config then
naming the local snapshot."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from hybridrl.cli.main import main
from hybridrl.config.hub import download_command

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    str(ROOT / "configs/quickstart.yaml"),
    f"warmup.files={ROOT / 'data/arith/sft.jsonl'}",
    f"data.train_files={ROOT / 'data/arith/train.jsonl'}",
    f"data.val_files={ROOT / 'data/arith/test.jsonl'}",
    "trainer.logger=[console]",
]


def test_the_download_command_is_the_installed_clients():
    major, minor = (int(x) for x in metadata.version("huggingface_hub").split(".")[:2])
    expected = "hf" if (major, minor) >= (0, 34) else "huggingface-cli"
    assert download_command("org/m") == f"{expected} download org/m --local-dir DIR"


def test_a_hub_id_is_refused_by_default_with_the_real_command(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("HYBRIDRL_ALLOW_HUB", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["explain", *ARGS, "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"]) == 2
    err = capsys.readouterr().err
    assert (
        f"`{download_command()}`" in err and "--allow-hub" in err and "huggingface-cli" not in err.replace(download_command(), "")
    )


def test_allow_hub_downloads_before_anything_loads(monkeypatch, tmp_path, capsys):
    import huggingface_hub

    asked = []

    def snapshot_download(repo_id, **kwargs):  # the network is not reachable from the tests: the Hub stands in
        asked.append(repo_id)
        return str(ROOT / "hybridrl/assets/tiny-arith")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.delenv("HYBRIDRL_ALLOW_HUB", raising=False)
    monkeypatch.setenv("HYBRIDRL_ALLOW_HUB", "0")
    out = tmp_path / "run"
    args = [*ARGS, "actor_rollout_ref.model.path=org/tiny", f"trainer.default_local_dir={out}", "trainer.total_training_steps=1"]
    args += ["warmup.steps=0", "trainer.val_before_train=false", "trainer.test_freq=-1"]
    monkeypatch.delenv("HYBRIDRL_ALLOW_HUB")
    assert main(["train", "--allow-hub", *args]) == 0, capsys.readouterr().err
    assert asked == ["org/tiny"]
    saved = (out / "config.yaml").read_text()
    assert f"path: {ROOT / 'hybridrl/assets/tiny-arith'}" in saved
