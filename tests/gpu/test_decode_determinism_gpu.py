"""trainer.deterministic on the GPU: two processes of the native engine, each with deterministic
algorithms on, sample the same tokens from the same weights (Qwen2.5-0.5B shapes, random weights,
64 prompts x 256 new tokens, EOS ignored). Without the pinned decode tile, two processes of the same
code drew different tokens on an H200 (BENCHMARKS.md, 2026-11-28): the tuned tile is chosen by timing.

Skipped without CUDA."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import hashlib, sys, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from hybridrl.trainer.determinism import make_deterministic
make_deterministic()
import rollout as R
from hybridrl.data import keys as K
from hybridrl.rollout import SamplingParams
from hybridrl.rollout.native.engine import NativeRolloutEngine
model = R.hf_model("Qwen2.5-0.5B", "cuda")
cfg = R.MODELS["Qwen2.5-0.5B"]
engine = NativeRolloutEngine(model.config, R._Tok(cfg["eos_token_id"], cfg["pad_token_id"]), device=torch.device("cuda"),
    max_model_len=384, max_num_seqs=64, gpu_memory_utilization=0.3, ignore_eos=True)
engine.load_weights(model.named_parameters())
prompts = R.make_prompts(64, 128, cfg["vocab_size"])
torch.manual_seed(0)
out = engine.generate(prompts, SamplingParams(n=1, temperature=1.0, max_new_tokens=256))
print("sha", hashlib.sha256(out[K.RESPONSES].cpu().numpy().tobytes()).hexdigest())
"""


def _tokens_digest() -> str:
    code = SCRIPT.format(root=str(ROOT), bench=str(ROOT / "benchmarks"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return [line for line in out.stdout.splitlines() if line.startswith("sha ")][-1]


def test_two_deterministic_processes_sample_the_same_tokens():
    assert _tokens_digest() == _tokens_digest()
