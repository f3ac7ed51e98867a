"""trainer.deterministic switches each order-dependent kernel family to its deterministic variant
(in a child process: the switches are process-wide)."""

import json
import os
import subprocess
import sys

CHILD = """
import json, os, torch
from hybridrl.trainer.determinism import make_deterministic
before = torch.are_deterministic_algorithms_enabled()
make_deterministic()
print(json.dumps({
    "before": before,
    "algorithms": torch.are_deterministic_algorithms_enabled(),
    "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
    "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    "cudnn": [torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
    "tf32": [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32],
}))
"""


def test_make_deterministic_sets_every_switch():
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True).stdout
    state = json.loads(out.strip().splitlines()[-1])
    assert state == {
        "before": False,
        "algorithms": True,
        "warn_only": True,
        "cublas": ":4096:8",
        "cudnn": [True, False],
        "tf32": [False, False],
    }
