"""hybridrl/preflight.py: under a launcher's several ranks every rank refuses in one line; an optional
backend the config names but this machine lacks is refused before any file is written, so the rerun runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli

import hybridrl
from hybridrl.preflight import launcher_refusal

ROOT = Path(__file__).resolve().parents[2]
QUICK = [
    str(ROOT / "configs/quickstart.yaml"),
    f"actor_rollout_ref.model.path={ROOT / 'hybridrl/assets/tiny-arith'}",
    f"warmup.files={ROOT / 'data/arith/sft.jsonl'}",
    f"data.train_files={ROOT / 'data/arith/train.jsonl'}",
    f"data.val_files={ROOT / 'data/arith/test.jsonl'}",
]


@pytest.mark.parametrize(
    ("env", "start"),
    [
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, "started by torchrun/accelerate as rank 1 of 2"),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, "started by torchrun/accelerate as rank 0 of 2"),
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3"}, "started by Slurm (srun) as rank 3 of 4"),
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "started by MPI (mpirun) as rank 1 of 2"),
    ],
)
def test_every_rank_of_a_launcher_refuses(env, start):
    line = launcher_refusal(env)
    assert line.startswith(start) and "trainer.n_gpus_per_node=N" in line and "\n" not in line


def test_one_process_per_node_runs():
    assert launcher_refusal({"WORLD_SIZE": "1", "RANK": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"}) is None
    assert launcher_refusal({"SLURM_NTASKS": "16", "SLURM_JOB_ID": "7"}) is None  # an sbatch script's own shell
    assert launcher_refusal({}) is None


def test_torchrun_with_two_processes_writes_nothing(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=0", "-m", "hybridrl", "train"]
    proc = subprocess.run(
        cmd + QUICK + [f"trainer.default_local_dir={out}"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hybridrl: error: started by torchrun")]
    assert errors and all(" of 2: hybridrl is one process" in line for line in errors), proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr  # torchrun's summary: a rank refused with the CLI's user-error status
    assert not out.exists()  # neither copy wrote a file into the folder


def test_api_refuses_under_a_launcher(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(hybridrl.HybridRLError, match="started by torchrun/accelerate as rank 1 of 2"):
        hybridrl.RLTrainer(QUICK[0], overrides=QUICK[1:] + [f"trainer.default_local_dir={tmp_path / 'run'}"]).fit()
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_missing_wandb_is_one_line_before_any_file_and_the_rerun_runs(tmp_path):
    out = tmp_path / "run"
    args = ["train", *QUICK, f"trainer.default_local_dir={out}", "trainer.total_training_steps=1", "warmup.steps=1"]
    proc = cli(*args, "trainer.logger=[console,wandb]", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        f"hybridrl: error: {QUICK[0]}: trainer.logger includes 'wandb', which is not installed: pip install wandb, "
        "or drop it: trainer.logger=[console]"
    )
    assert "Traceback" not in proc.stderr and not out.exists()
    cli(*args, "trainer.logger=[console]", "trainer.test_freq=-1", "trainer.val_before_train=false")
    assert (out / "checkpoints/step_1").is_dir()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_rollout_name_vllm_means_the_same_with_and_without_a_file():
    from hybridrl.config import load_config

    vllm = "actor_rollout_ref.rollout.name=vllm"
    with_file = load_config(QUICK[0], QUICK[1:] + [vllm])
    argv = load_config(
        None, [f"data.train_files={ROOT / 'data/arith/train.jsonl'}", "actor_rollout_ref.model.path=m", vllm], verl="ppo"
    )
    for cfg in (with_file, argv):
        assert cfg.actor_rollout_ref.rollout.name == "auto"
        assert any(n.startswith(f"{vllm}: hybridrl's own engine generates") and "pip install vllm" in n for n in cfg.notices)
