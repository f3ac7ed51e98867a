"""`hybridrl export` writes the model in the dtype it came in (verl's model merger does the same),
not the float32 of the training masters; --dtype overrides."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hybridrl.cli.main import main
from hybridrl.models.loading import load_causal_lm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, arith_data, tiny_model_dir):
    root = tmp_path_factory.mktemp("bf16")
    model_dir = Path(shutil.copytree(tiny_model_dir, root / "model"))  # rewritten in bf16 below
    torch.manual_seed(0)
    load_causal_lm(str(model_dir), random_init=True).to(torch.bfloat16).save_pretrained(model_dir)
    hf = json.loads((model_dir / "config.json").read_text())
    assert (hf.get("torch_dtype") or hf.get("dtype")) == "bfloat16"
    run = root / "run"
    assert (
        main(
            [
                "train",
                f"actor_rollout_ref.model.path={model_dir}",
                f"data.train_files={arith_data['train']}",
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "trainer.n_gpus_per_node=1",
                "trainer.total_training_steps=1",
                "trainer.device=cpu",
                "trainer.logger=console",
                f"trainer.default_local_dir={run}",
                "data.max_prompt_length=8",
                "data.max_response_length=4",
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.rollout.n=2",
                "trainer.val_before_train=false",
            ]
        )
        == 0
    )
    return run


def _dtypes(hf_dir: Path) -> set:
    return {t.dtype for t in load_file(str(hf_dir / "model.safetensors")).values()}


def test_export_keeps_the_models_own_dtype(bf16_run, tmp_path, capsys):
    assert main(["export", str(bf16_run), str(tmp_path / "auto")]) == 0
    assert "bfloat16: the dtype of" in capsys.readouterr().out
    assert _dtypes(tmp_path / "auto") == {torch.bfloat16}
    size16 = (tmp_path / "auto" / "model.safetensors").stat().st_size
    assert main(["export", str(bf16_run), str(tmp_path / "fp32"), "--dtype", "float32"]) == 0
    assert _dtypes(tmp_path / "fp32") == {torch.float32}
    size32 = (tmp_path / "fp32" / "model.safetensors").stat().st_size
    assert 1.9 < size32 / size16 < 2.1  # half the bytes, as the model came
    a, b = load_file(str(tmp_path / "auto" / "model.safetensors")), load_file(str(tmp_path / "fp32" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k].bfloat16(), rtol=0, atol=0)  # the same weights, rounded once


def test_export_of_a_moved_checkpoint_falls_back_to_float32(bf16_run, tmp_path, capsys):
    import shutil

    moved = tmp_path / "elsewhere" / "actor"
    shutil.copytree(bf16_run / "checkpoints" / "step_1" / "actor", moved)
    assert main(["export", str(moved), str(tmp_path / "out")]) == 0
    assert "float32: the base model's dtype is unknown" in capsys.readouterr().out
    assert _dtypes(tmp_path / "out") == {torch.float32}
