#!/usr/bin/env bash
# GRPO on GSM8K with a real instruct model on one GPU: accuracy before, a wall-clock-bounded run,
# accuracy after (all 1,319 test questions, greedy, strict and flexible), in stages so that each
# fits one device call:
#   benchmarks/gsm8k_grpo.sh before MODEL_DIR GSM8K_DIR OUT
#   benchmarks/gsm8k_grpo.sh train  MODEL_DIR GSM8K_DIR OUT [key=value overrides...]
#   benchmarks/gsm8k_grpo.sh after  MODEL_DIR GSM8K_DIR OUT
# GSM8K_DIR holds train.jsonl / test.jsonl (question/answer rows). The run's settings are
# configs/gsm8k_grpo.yaml plus the overrides below (BENCHMARKS.md's run 3, the reward that teaches
# the "#### N" format: with flexible_score alone, run 2, the format is never learned)
# plus any given on the command line. Plot afterwards:
#   python benchmarks/plot_curves.py OUT/run/metrics.jsonl --out docs/img/gsm8k_grpo.png
set -euo pipefail
STAGE=${1:?stage: before|train|after}; MODEL=${2:?model dir}; DATA=${3:?gsm8k dir}; OUT=${4:?out dir}; shift 4
mkdir -p "$OUT/data"
for split in train test; do
  [[ -f $OUT/data/$split.parquet ]] || python -m hybridrl data gsm8k --input "$DATA/$split.jsonl" --output "$OUT/data/$split.parquet"
done
evaluate() {  # $1 model dir, $2 name
  python -m hybridrl eval --model "$1" --data "$OUT/data/test.parquet" --max-response-length 512 --batch-size 512 \
    --output "$OUT/eval_$2.jsonl" --summary "$OUT/eval_$2.json"
}
case $STAGE in
  before) evaluate "$MODEL" before ;;
  train)
    python -m hybridrl train configs/gsm8k_grpo.yaml \
      actor_rollout_ref.model.path="$MODEL" data.train_files="$OUT/data/train.parquet" data.val_files=null \
      data.train_batch_size=32 actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.rollout.n=16 \
      actor_rollout_ref.actor.optim.lr=2e-6 \
      custom_reward_function.reward_kwargs="{format_score: 0.1, format_needs_work: true, flexible_score: 0.2}" \
      trainer.max_wall_time_s=400 trainer.save_freq=-1 trainer.default_local_dir="$OUT/run" trainer.log_samples=2 \
      "$@" ;;
  after) evaluate "$OUT/run/checkpoints/$(cat "$OUT/run/checkpoints/latest")/actor" after ;;
  *) echo "unknown stage $STAGE (before|train|after)" >&2; exit 2 ;;
esac
