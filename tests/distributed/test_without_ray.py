"""Ray is an extra (`pip install 'hybridrl[ray]'`): with it unimportable, one device trains (the quickstart's
path, through the CLI's entry and the Python API), and asking for several devices is one line naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["ray"] = None  # `import ray` raises ImportError, as where it is not installed
    from hybridrl.cli.main import main

    common = [
        "{root}/configs/quickstart.yaml",
        "actor_rollout_ref.model.path={root}/hybridrl/assets/tiny-arith",
        "data.train_files={root}/data/arith/train.jsonl",
        "data.val_files={root}/data/arith/test.jsonl",
        "warmup.files={root}/data/arith/sft.jsonl",
        "trainer.logger=[console,jsonl]",
        "trainer.total_training_steps=2", "warmup.steps=2", "trainer.test_freq=-1", "trainer.val_before_train=false",
    ]
    assert main(["train", *common, "trainer.default_local_dir={out}/one"]) == 0
    assert main(["train", *common, "trainer.default_local_dir={out}/two", "trainer.n_gpus_per_node=2",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64"]) == 2
    print("RAY_IMPORTED", sys.modules.get("ray") is not None)
    """
)


def test_one_device_trains_without_ray_and_several_devices_name_the_extra(tmp_path):
    script = SCRIPT.format(root=ROOT, out=tmp_path)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "RAY_IMPORTED False" in proc.stdout
    assert (tmp_path / "one/checkpoints/step_2").is_dir()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("hybridrl: error: ") and "need Ray, which is not installed: pip install 'hybridrl[ray]'" in last
    assert not (tmp_path / "two").exists()
