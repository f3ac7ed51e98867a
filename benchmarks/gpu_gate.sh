#!/usr/bin/env bash
# The GPU gate. Every change to hybridrl/rollout/, hybridrl/models/ or a kernel runs it once on a GPU
# and reports its table beside the change (CONTRIBUTING in docs/performance.md): speed that costs
# learning is not speed. One device call, under 10 minutes on one H100/H200:
#   bash benchmarks/gpu_gate.sh MODEL_DIR GSM8K_DIR OUT
# MODEL_DIR: a local HF instruct model (Qwen2.5-Coder-0.5B-Instruct from ../shared/tools/get_models.sh;
# benchmarks/lab/gguf_to_hf.py makes it from the GGUF that travels); GSM8K_DIR: train.jsonl / test.jsonl.
# It runs, and fails on the first that fails:
#   1. the GPU tests (tests/gpu: the sampler statistics at 151,936 entries, every hash value of the
#      fused noise, the real model's draws against softmax, the engine's samples scored by the
#      model in float32; CUDA graphs, packing, varlen) and the kernel tests directly on CUDA;
#   2. two short GSM8K learning runs on the real model, the learning table's GRPO and PPO recipes
#      (benchmarks/learning_table.py; docs/learning.md), checked by benchmarks/learning_checks.py:
#      GRPO: the "#### N" format rate rises (mean of the last 5 steps - first 3 >= 0.15); PPO with its
#      critic: the critic's value loss (critic/vf_loss) falls (last 5 below first 3), its format rate
#      reported only (16 steps at verl's quickstart lr do not move it: docs/learning.md);
#      both: the improbable-token share (rollout/improbable_token_frac) stays under the alarm's 1e-3.
# On a machine of 2 GPUs the tests that need two devices (Ray, NCCL, FSDP2: minutes each) run too:
# give the gate a call of its own there, or CUDA_VISIBLE_DEVICES=0 for the one-GPU gate.
# GATE_PART=tests, then GATE_PART=learn into the same OUT: the two halves in two calls, back to back
# (the machine's /tmp survives between calls while it stays warm), when one call cannot hold both.
# Prints a table (also OUT/gate.md). GATE_STEPS (default 16) and GATE_PPO_STEPS (default 16) set the
# learning runs' lengths. Why 16 each, where one 24-step GRPO run was: both must fit the one call beside
# the tests. In the 9-minute GRPO run (BENCHMARKS.md, 2026-11-28) the format rate was 2.5% over steps
# 1-3, 36% over 4-10 and 93% over 11-20, so steps 12-16 are far past the 0.15 gain; at ~2.6 s a step
# and ~30 s of start-up the run takes ~75 s instead of ~95 s. PPO (verl's quickstart batch: 256 prompts x
# 1 sample, 4 mini-batches, the critic's passes): 3.29 s a step, 116 s for the run (H200, 2026-11-29); the
# GRPO run 2.64 s a step, 121 s; the GPU tests 337 s: the whole gate ~10 min, so run it as its two halves.
# HYBRIDRL_SAMPLER_DRAWS (default 10^7, the fused path) / HYBRIDRL_SAMPLER_DRAWS_SLOW (default here
# 250,000: the torch, top-k/top-p and TP paths are ~20x slower per draw, and with 10^6 the tests
# alone passed 440 s on an H200; 250,000 still covers every hash value ~2,300 times) the draws per
# sampler test; `python -m pytest tests/gpu` alone runs 10^7 on every path.
set -euo pipefail
MODEL=${1:?model dir}; DATA=${2:?gsm8k dir}; OUT=${3:?out dir}
STEPS=${GATE_STEPS:-16}; PPO_STEPS=${GATE_PPO_STEPS:-16}
mkdir -p "$OUT"
export HYBRIDRL_SAMPLER_DRAWS_SLOW=${HYBRIDRL_SAMPLER_DRAWS_SLOW:-250000}
export HYBRIDRL_GPU_MODEL=$MODEL HYBRIDRL_GPU_GSM8K=$DATA/test.jsonl PYTHONUNBUFFERED=1
PART=${GATE_PART:-all}  # all | tests | learn: the two halves in calls of their own (OUT kept between them)
case "$PART" in all | tests | learn) ;; *) echo "GATE_PART=$PART: one of all, tests, learn" >&2; exit 2 ;; esac
t0=$(date +%s)
# A test that hangs fails after GATE_TEST_TIMEOUT s (pytest-timeout, on the GPU image) with every thread's
# stack, instead of taking the whole device call; the CLI runs the tests start (and their Ray workers)
# write their stacks every HYBRIDRL_DUMP_STACKS_S s meanwhile.
export HYBRIDRL_DUMP_STACKS_S=${HYBRIDRL_DUMP_STACKS_S:-120}
TIMEOUT=()
python -c "import pytest_timeout" 2>/dev/null && TIMEOUT=(--timeout="${GATE_TEST_TIMEOUT:-300}")
if [ "$PART" != learn ]; then
  python -m pytest tests/gpu tests/rollout/test_native_gpu.py tests/rollout/test_native_kernels.py \
    tests/models/test_logprob_kernels.py -x -q -rs -s -p no:cacheprovider --durations=15 "${TIMEOUT[@]}" 2>&1 | tee "$OUT/gpu_tests.log"
  echo $(($(date +%s) - t0)) >"$OUT/tests_s"
  if [ "$PART" = tests ]; then echo "[gate] GPU tests passed in $(cat "$OUT/tests_s") s; the learning half: GATE_PART=learn" >&2; exit 0; fi
fi
unset HYBRIDRL_DUMP_STACKS_S
[ -f "$OUT/tests_s" ] || { echo "[gate] GATE_PART=learn: run GATE_PART=tests into $OUT first" >&2; exit 2; }
t1=$(date +%s)
python -m hybridrl data gsm8k --input "$DATA/train.jsonl" --output "$OUT/data/train.parquet" > /dev/null
learn() {  # $1 recipe, $2 run directory under OUT, $3 steps: the learning table's recipe, step-bounded
  local args
  args=$(python benchmarks/learning_table.py train-args "$1" --model "$MODEL" --data "$OUT/data" --run "$OUT/$2")
  mapfile -t args <<<"$args"
  rm -rf "$OUT/$2"
  python -m hybridrl train "${args[@]}" trainer.total_training_steps="$3" 2>&1 | tee "$OUT/train_$1.log" |
    grep -E "^\[hybridrl|warning|step +[0-9]+/" || true
}
learn grpo run "$STEPS"
t2=$(date +%s)
learn ppo run_ppo "$PPO_STEPS"
t3=$(date +%s)
python benchmarks/learning_checks.py gate "$OUT" --tests-s "$(cat "$OUT/tests_s")" --grpo-s $((t2 - t1)) --ppo-s $((t3 - t2))
