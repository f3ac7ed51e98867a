#!/usr/bin/env bash
# The GPU gate. Every change to hybridrl/rollout/, hybridrl/models/ or a kernel runs it once on a GPU
# and reports its table beside the change (CONTRIBUTING in docs/performance.md): speed that costs
# learning is not speed. One device call, under 10 minutes on one H100/H200:
#   bash benchmarks/gpu_gate.sh MODEL_DIR GSM8K_DIR OUT
# MODEL_DIR: a local HF instruct model (Qwen2.5-Coder-0.5B-Instruct from ../shared/tools/get_models.sh;
# benchmarks/gguf_to_hf.py makes it from the GGUF that travels); GSM8K_DIR: train.jsonl / test.jsonl.
# It runs, and fails on the first that fails:
#   1. the GPU tests (tests/gpu: the sampler statistics at 151,936 entries, every hash value of the
#      fused noise, the real model's draws against softmax, the engine's samples scored by the
#      model in float32; CUDA graphs, packing, varlen) and the kernel tests directly on CUDA;
#   2. a short GSM8K GRPO run on the real model: the "#### N" format rate must rise, the
#      improbable-token share (rollout/improbable_token_frac) must stay under the alarm's 1e-3.
# On a machine of 2 GPUs the tests that need two devices (Ray, NCCL, FSDP2: minutes each) run too:
# give the gate a call of its own there, or CUDA_VISIBLE_DEVICES=0 for the one-GPU gate.
# Prints a table (also OUT/gate.md). GATE_STEPS (default 24) sets the learning run's length,
# HYBRIDRL_SAMPLER_DRAWS (default 10^7, the fused path) / HYBRIDRL_SAMPLER_DRAWS_SLOW (default here
# 250,000: the torch, top-k/top-p and TP paths are ~20x slower per draw, and with 10^6 the tests
# alone passed 440 s on an H200; 250,000 still covers every hash value ~2,300 times) the draws per
# sampler test; `python -m pytest tests/gpu` alone runs 10^7 on every path.
set -euo pipefail
MODEL=${1:?model dir}; DATA=${2:?gsm8k dir}; OUT=${3:?out dir}
STEPS=${GATE_STEPS:-24}
mkdir -p "$OUT"
export HYBRIDRL_SAMPLER_DRAWS_SLOW=${HYBRIDRL_SAMPLER_DRAWS_SLOW:-250000}
export HYBRIDRL_GPU_MODEL=$MODEL HYBRIDRL_GPU_GSM8K=$DATA/test.jsonl PYTHONUNBUFFERED=1
t0=$(date +%s)
# A test that hangs fails after GATE_TEST_TIMEOUT s (pytest-timeout, on the GPU image) with every thread's
# stack, instead of taking the whole device call; the CLI runs the tests start (and their Ray workers)
# write their stacks every HYBRIDRL_DUMP_STACKS_S s meanwhile.
export HYBRIDRL_DUMP_STACKS_S=${HYBRIDRL_DUMP_STACKS_S:-120}
TIMEOUT=()
python -c "import pytest_timeout" 2>/dev/null && TIMEOUT=(--timeout="${GATE_TEST_TIMEOUT:-300}")
python -m pytest tests/gpu tests/rollout/test_native_gpu.py tests/rollout/test_native_kernels.py \
  tests/models/test_logprob_kernels.py -x -q -rs -s -p no:cacheprovider --durations=15 "${TIMEOUT[@]}" 2>&1 | tee "$OUT/gpu_tests.log"
unset HYBRIDRL_DUMP_STACKS_S
t1=$(date +%s)
python -m hybridrl data gsm8k --input "$DATA/train.jsonl" --output "$OUT/data/train.parquet" > /dev/null
rm -rf "$OUT/run"
python -m hybridrl train configs/gsm8k_grpo.yaml \
  actor_rollout_ref.model.path="$MODEL" data.train_files="$OUT/data/train.parquet" data.val_files=null \
  data.train_batch_size=32 actor_rollout_ref.rollout.n=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  actor_rollout_ref.actor.optim.lr=2e-6 trainer.total_training_steps="$STEPS" \
  custom_reward_function.reward_kwargs="{format_score: 0.1, format_needs_work: true, flexible_score: 0.2}" \
  trainer.save_freq=-1 trainer.resume_mode=disable trainer.default_local_dir="$OUT/run" trainer.log_samples=2 \
  trainer.logger=[console,jsonl] 2>&1 | tee "$OUT/train.log" | grep -E "^\[hybridrl|warning|step +[0-9]+/" || true
t2=$(date +%s)
python - "$OUT" "$((t1 - t0))" "$((t2 - t1))" <<'PY'
import json, sys
out, t_tests, t_train = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.loads(l) for l in open(f"{out}/run/metrics.jsonl") if l.strip()]
steps = [r for r in rows if r.get("step", 0) >= 1]
fmt = [r["reward/gsm8k_format/mean"] for r in steps]
imp = [r.get("rollout/improbable_token_frac", float("nan")) for r in steps]
first, last = sum(fmt[:3]) / 3, sum(fmt[-5:]) / 5
checks = {
    "format rate rises (last 5 steps - first 3 >= 0.15)": last - first >= 0.15,
    "improbable-token share < 1e-3 on every step": all(x < 1e-3 for x in imp),
}
table = [
    "| gate | value |",
    "| --- | --- |",
    f"| GPU tests | passed ({t_tests} s) |",
    f"| learning run | {len(steps)} steps in {t_train} s |",
    f"| `reward/gsm8k_format/mean` first 3 -> last 5 steps | {first:.3f} -> {last:.3f} |",
    f"| `critic/score/mean` first 3 -> last 5 | {sum(r['critic/score/mean'] for r in steps[:3]) / 3:.3f} -> "
    f"{sum(r['critic/score/mean'] for r in steps[-5:]) / 5:.3f} |",
    f"| `rollout/improbable_token_frac` max | {max(imp):.2e} |",
    f"| `training/rollout_probs_diff_mean` max | {max(r.get('training/rollout_probs_diff_mean', 0) for r in steps):.4f} |",
    f"| median step s (after the first) | {sorted(r['timing_s/step'] for r in steps[1:])[len(steps[1:]) // 2]:.2f} |",
] + [f"| {k} | {'PASS' if v else 'FAIL'} |" for k, v in checks.items()]
print("\n".join(table))
open(f"{out}/gate.md", "w").write("\n".join(table) + "\n")
sys.exit(0 if all(checks.values()) else 1)
PY
