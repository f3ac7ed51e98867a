"""Shared fixtures: a tiny Qwen2-architecture model directory and the arithmetic task data.

Nothing is downloaded: the model is built from a config with random weights.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

# One CPU kernel family for the whole session, set before torch is imported (the CLI server and the
# subprocesses inherit it): the golden metrics (tests/e2e/golden) were made with the AVX2 kernels,
# and an AVX-512 machine's kernels round differently: a short run's metrics then differ from them in
# the last digits, and the quickstart's drift. Any x86-64 machine with AVX-512 has AVX2. A value
# already set (e.g. ATEN_CPU_CAPABILITY=default) wins.
if platform.machine().lower() in ("x86_64", "amd64"):
    os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")

import pytest  # noqa: E402
import torch  # noqa: E402

from hybridrl.data.converters import make_arith
from hybridrl.models.tiny import write_tiny_model_dir

sys.path.insert(0, str(Path(__file__).parent))  # shared helpers (tiny_models, spmd_helpers) by name
from tiny_models import SHAPE  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """config.json + char tokenizer, no weights (load with random_init=True); tests/tiny_models.py's SHAPE."""
    return str(write_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), **SHAPE))


@pytest.fixture(scope="session")
def tiny_model_with_weights(tiny_model_dir, tmp_path_factory):
    """The same tiny model saved with (random) weights, as a real checkpoint directory."""
    from hybridrl.models.loading import load_causal_lm, load_tokenizer

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny-weights")
    load_causal_lm(tiny_model_dir, random_init=True).save_pretrained(out)
    load_tokenizer(tiny_model_dir).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def arith_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    return make_arith(str(out), n_train=64, n_test=16, n_sft=64, max_operand=20, seed=0)


# The end-to-end tests share `tests/e2e/cli_helpers.py`, the API tests `tests/api/api_helpers.py`,
# the kernel tests `tests/triton_helpers.py`; pytest's importlib mode does not put test folders on
# sys.path, so add those.
sys.path.insert(0, str(Path(__file__).parent / "e2e"))
sys.path.insert(0, str(Path(__file__).parent / "api"))
sys.path.insert(0, str(Path(__file__).parent / "rollout" / "agent"))
sys.path.insert(0, str(Path(__file__).parent / "workers"))

# CI fails on a skip whose reason is not on the allow-list (tests/skip_policy.py).
from skip_policy import pytest_sessionfinish, pytest_terminal_summary  # noqa: E402, F401
