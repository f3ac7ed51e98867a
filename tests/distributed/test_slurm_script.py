"""examples/slurm/hybridrl.sbatch starts the layout the two-node test runs: a Ray head on the
first allocated node, a Ray worker on each of the others (joining the head), then `hybridrl train`
with trainer.nnodes from the allocation. Checked on its dry run (HYBRIDRL_DRY_RUN=1), with fake
`scontrol` and `srun` that answer the two lookups the script makes (node names, the head's IP)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "slurm" / "hybridrl.sbatch"


def _fake_slurm(tmp_path: Path, nodes: list[str]) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/usr/bin/env bash\n"
        '[ "$1 $2" = "show hostnames" ] || { echo "scontrol: unexpected $*" >&2; exit 2; }\n'
        f'[ "$3" = "$SLURM_JOB_NODELIST" ] && printf "%s\\n" {" ".join(nodes)}\n'
    )
    # srun: only the head's IP lookup may run on a dry run; it is logged to check where it ran.
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {tmp_path}/srun.log\n'
        'case " $* " in *" hostname --ip-address "*) echo "10.0.0.7 fe80::7";; *) echo "srun ran: $*" >&2; exit 3;; esac\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def _dry_run(tmp_path, nodes, env, *args) -> list[list[str]]:
    bin_dir = _fake_slurm(tmp_path, nodes)
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_"))},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HYBRIDRL_DRY_RUN": "1",
        "SLURM_JOB_NODELIST": "gpu-[1-9]",
        **env,
    }
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines()]


def test_head_on_the_first_node_workers_on_the_rest_then_train(tmp_path):
    lines = _dry_run(
        tmp_path,
        ["gpu-1", "gpu-2", "gpu-3"],
        {"SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_ON_NODE": "96"},
        "configs/gsm8k_grpo.yaml",
        "trainer.device=cuda",
        "trainer.experiment_name=a b",
    )
    srun = ["srun", "--overlap", "--nodes=1", "--ntasks=1", "-w"]
    assert lines == [
        [*srun, "gpu-1", "ray", "start", "--head", "--node-ip-address=10.0.0.7", "--port=6379"]
        + ["--num-gpus=8", "--num-cpus=96", "--block", "&"],
        [*srun, "gpu-2", "ray", "start", "--address=10.0.0.7:6379", "--num-gpus=8", "--num-cpus=96", "--block", "&"],
        [*srun, "gpu-3", "ray", "start", "--address=10.0.0.7:6379", "--num-gpus=8", "--num-cpus=96", "--block", "&"],
        ["hybridrl", "train", "configs/gsm8k_grpo.yaml", "trainer.nnodes=3", "trainer.n_gpus_per_node=8"]
        + ["ray_init.address=10.0.0.7:6379", "trainer.device=cuda", "trainer.experiment_name=a b"],
    ]
    # The head's address was looked up on the head node itself, and nothing else ran.
    assert (tmp_path / "srun.log").read_text().splitlines() == ["--nodes=1 --ntasks=1 -w gpu-1 hostname --ip-address"]


@pytest.mark.parametrize("gpus", ["h100:4", "4"])
def test_one_node_is_a_head_alone_and_gpus_per_node_reads_a_typed_count(tmp_path, gpus):
    lines = _dry_run(tmp_path, ["gpu-9"], {"SLURM_GPUS_PER_NODE": gpus, "SLURM_CPUS_ON_NODE": "8"}, "c.yaml", "x=1")
    assert [line[6:9] for line in lines[:-1]] == [["ray", "start", "--head"]]
    assert "--num-gpus=4" in lines[0]
    assert lines[-1] == ["hybridrl", "train", "c.yaml", "trainer.nnodes=1", "trainer.n_gpus_per_node=4"] + [
        "ray_init.address=10.0.0.7:6379",
        "x=1",
    ]


def test_a_config_is_required(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env={**os.environ, "HYBRIDRL_DRY_RUN": "1"})
    assert proc.returncode != 0 and "usage: sbatch" in proc.stderr
