#!/usr/bin/env bash
# The learning table (issue 51, docs/learning.md): one recipe trained on GSM8K for a fixed wall-clock
# budget, then greedy strict and flexible accuracy on all 1,319 test questions, in stages that each fit
# one device call (10 minutes):
#   benchmarks/learning_table.sh before RECIPE MODEL_DIR GSM8K_DIR OUT   # the base model's row
#   benchmarks/learning_table.sh train  RECIPE MODEL_DIR GSM8K_DIR OUT [key=value overrides...]
#   benchmarks/learning_table.sh after  RECIPE MODEL_DIR GSM8K_DIR OUT   # evaluates OUT's last checkpoint
#   benchmarks/learning_table.sh row    RECIPE MODEL_DIR GSM8K_DIR OUT   # prints the row, writes OUT/results/
# RECIPE: grpo, ppo, dapo, grpo_lora, rloo, tool, notool, smollm2_grpo (benchmarks/learning_table.py
# lists each one's config in configs/ and its overrides: `python benchmarks/learning_table.py train-args
# RECIPE --model M --data D --run R` prints the exact command). GSM8K_DIR holds train.jsonl and
# test.jsonl (question/answer rows). OUT is one row's directory: its data, run, checkpoint and evals;
# OUT/results/ is what to keep (row.md, row.json, reward_vs_time.svg, metrics.jsonl, samples.jsonl,
# eval summaries and answers: a few MB; the checkpoint stays in OUT/run).
# On the GPU machine the checkpoint lives in OUT until the machine is given back, so run `train` in one
# call and `after` + `row` in the next call, back to back, with OUT under /tmp (docs/learning.md).
# Environment:
#   BUDGET_S (540): trainer.max_wall_time_s, counted from launch (model load and compilation included);
#     the run stops after the first step that ends past it and saves, so launch + data + 540 s + the last
#     step + the checkpoint fit a 600-second call.
#   MODE (sync | one_step_off | async), GPUS (1), POOL (rollout GPUs of their own; default GPUS/2 for the
#     off-policy modes, 0 = colocated), PARTIAL (async_training.partial_rollout; default 1 for async),
#     STALENESS (2, async): issue 51's item 2 compares sync colocated, one_step_off and async with partial
#     rollouts on the same recipe at the same budget. They need several GPUs (2 or 4: the nvidia-h200-x2 /
#     -x4 kinds), e.g. MODE=async GPUS=4 bash benchmarks/learning_table.sh train grpo M G /tmp/lt/async4.
#   TOOL_CONFIG (configs/tools/python.yaml): the tool recipe's tool config (a copy with sandbox_fusion_url
#     or allow_unsafe_fallback where the local sandbox cannot run).
#   EVAL_ARGS: extra `hybridrl eval` flags (word-split), e.g. "--limit 8" for a smoke run.
set -euo pipefail
STAGE=${1:?stage: before|train|after|row}; RECIPE=${2:?recipe}; MODEL=${3:?model dir}; DATA=${4:?gsm8k dir}; OUT=${5:?out dir}
shift 5
case $STAGE in before | train | after | row) ;; *) echo "unknown stage $STAGE (before|train|after|row)" >&2; exit 2 ;; esac
abs() { realpath -m -- "$1"; }
MODEL=$(abs "$MODEL"); DATA=$(abs "$DATA"); OUT=$(abs "$OUT"); TOOL_CONFIG=${TOOL_CONFIG:+$(abs "$TOOL_CONFIG")}
cd "$(dirname "$0")/.."  # the recipes' configs/ paths start at the repository
TOOL_CONFIG=${TOOL_CONFIG:-$PWD/configs/tools/python.yaml}
TABLE=(python benchmarks/learning_table.py)
lines() {  # ARGS=(the command's output lines); the script stops when the command fails
  local text
  text=$("$@")
  ARGS=()
  if [[ -n $text ]]; then mapfile -t ARGS <<<"$text"; fi
}
lines "${TABLE[@]}" data-args "$RECIPE"  # also rejects an unknown recipe before anything runs
DATA_FLAGS=("${ARGS[@]}")
mkdir -p "$OUT"
if [[ -f $OUT/recipe && $(cat "$OUT/recipe") != "$RECIPE" ]]; then
  echo "$OUT holds the row of recipe $(cat "$OUT/recipe"), not $RECIPE: give each row its own OUT" >&2; exit 2
fi
echo "$RECIPE" >"$OUT/recipe"
if [[ $STAGE == before || $STAGE == train ]]; then echo "$MODEL" >"$OUT/model_dir"; fi  # the row names the model

prepare() {  # OUT/data/{train,test}.parquet in the recipe's prompt format
  mkdir -p "$OUT/data"
  for split in train test; do
    [[ -f $DATA/$split.jsonl ]] || { echo "$DATA/$split.jsonl does not exist: GSM8K_DIR holds train.jsonl and test.jsonl" >&2; exit 2; }
    [[ -f $OUT/data/$split.parquet ]] ||
      python -m hybridrl data gsm8k "${DATA_FLAGS[@]}" --input "$DATA/$split.jsonl" --output "$OUT/data/$split.parquet" >/dev/null
  done
}
evaluate() {  # $1 model dir, $2 name: OUT/eval_NAME.json (accuracies) and .jsonl (every answer)
  lines "${TABLE[@]}" eval-args "$RECIPE" --tool-config "$TOOL_CONFIG"
  # shellcheck disable=SC2086  # EVAL_ARGS is a list of flags
  python -m hybridrl eval --model "$1" --data "$OUT/data/test.parquet" "${ARGS[@]}" \
    --output "$OUT/eval_$2.jsonl" --summary "$OUT/eval_$2.json" ${EVAL_ARGS:-}
}
case $STAGE in
  before)
    prepare
    evaluate "$MODEL" before ;;
  train)
    lines "${TABLE[@]}" train-args "$RECIPE" --model "$MODEL" --data "$OUT/data" --run "$OUT/run" \
      --budget-s "${BUDGET_S:-540}" --mode "${MODE:-sync}" --gpus "${GPUS:-1}" ${POOL:+--pool "$POOL"} \
      ${PARTIAL:+--partial "$PARTIAL"} --staleness "${STALENESS:-2}" --tool-config "$TOOL_CONFIG"
    prepare
    rm -rf "$OUT/run" "$OUT/eval_after.json" "$OUT/eval_after.jsonl"  # a rerun starts clean
    echo "[learning_table] $RECIPE: hybridrl train ${ARGS[*]} $*" >&2
    python -m hybridrl train "${ARGS[@]}" "$@" 2>&1 | tee "$OUT/train.log" ;;
  after)
    latest=$OUT/run/checkpoints/latest
    [[ -f $latest ]] || { echo "$latest does not exist: run the train stage into $OUT first (in this machine's session)" >&2; exit 2; }
    evaluate "$OUT/run/checkpoints/$(cat "$latest")/actor" after ;;
  row) "${TABLE[@]}" row "$RECIPE" "$OUT" ;;
esac
