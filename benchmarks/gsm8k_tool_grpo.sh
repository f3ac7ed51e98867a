#!/usr/bin/env bash
# GRPO on GSM8K with the python tool (multi-turn, code format) on one GPU: accuracy before, a
# wall-clock-bounded run, accuracy after (all 1,319 test questions, greedy, with the tool), in
# stages that each fit one device call:
#   benchmarks/gsm8k_tool_grpo.sh before MODEL_DIR GSM8K_DIR OUT
#   benchmarks/gsm8k_tool_grpo.sh train  MODEL_DIR GSM8K_DIR OUT [key=value overrides...]
#   benchmarks/gsm8k_tool_grpo.sh after  MODEL_DIR GSM8K_DIR OUT
# GSM8K_DIR holds train.jsonl / test.jsonl (question/answer rows). `before` also runs the same
# prompts single-turn (no tool) at the same batch, for the tokens/s comparison; every eval's
# summary JSON has the engine's tokens/s and the agent metrics (turns, tool calls, waiting on tools).
set -euo pipefail
STAGE=${1:?stage: before|train|after}; MODEL=${2:?model dir}; DATA=${3:?gsm8k dir}; OUT=${4:?out dir}; shift 4
mkdir -p "$OUT/data"
for split in train test; do
  [[ -f $OUT/data/$split.parquet ]] || python -m hybridrl data gsm8k --tools python --input "$DATA/$split.jsonl" --output "$OUT/data/$split.parquet"
done
TOOL_CONFIG=${TOOL_CONFIG:-configs/tools/python.yaml}  # e.g. a copy with sandbox_fusion_url or allow_unsafe_fallback
TOOLS=(--tool-config "$TOOL_CONFIG" --multi-turn-format code --max-assistant-turns 3)
evaluate() {  # $1 model dir, $2 name, then extra flags
  local model=$1 name=$2; shift 2
  python -m hybridrl eval --model "$model" --data "$OUT/data/test.parquet" --max-response-length 1024 --batch-size 512 \
    --output "$OUT/eval_$name.jsonl" --summary "$OUT/eval_$name.json" "$@"
}
case $STAGE in
  before)
    evaluate "$MODEL" before_tool "${TOOLS[@]}"
    evaluate "$MODEL" before_single_turn ;;
  train)
    python -m hybridrl train configs/gsm8k_tool_grpo.yaml \
      actor_rollout_ref.model.path="$MODEL" data.train_files="$OUT/data/train.parquet" data.val_files=null \
      actor_rollout_ref.rollout.multi_turn.tool_config_path="$TOOL_CONFIG" \
      trainer.max_wall_time_s=480 trainer.save_freq=-1 trainer.default_local_dir="$OUT/run" trainer.log_samples=2 \
      "$@" ;;
  after) evaluate "$OUT/run/checkpoints/$(cat "$OUT/run/checkpoints/latest")/actor" after_tool "${TOOLS[@]}" ;;
  *) echo "unknown stage $STAGE (before|train|after)" >&2; exit 2 ;;
esac
