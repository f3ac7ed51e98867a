#!/usr/bin/env bash
# Rows of the learning table (docs/learning.md), one after another, detached from the shell that starts
# them: a 10-minute row (BUDGET_S=600 from launch, plus its checkpoint and the 1,319-question eval) does
# not fit one 600-second device call, and rows that run back to back leave the GPU no idle time between
# calls. The device calls only start the queue and then wait on it.
#   benchmarks/learning_queue.sh start MODEL_DIR GSM8K_DIR ROOT ROW [ROW ...]
#   benchmarks/learning_queue.sh wait ROOT SECONDS [DEST]
# ROW is RECIPE (train, after, row: a trained row), base:RECIPE (before, row: the base model's row under
# that recipe's prompt and eval, e.g. base:grpo, base:tool) or either with =MODEL_DIR for another model
# (smollm2_grpo=/tmp/smollm2, base:smollm2_grpo=/tmp/smollm2). Each row runs in ROOT/NAME (NAME: the
# recipe, or base_RECIPE); when it ends, ROOT/NAME.tgz holds its results/ and logs, a few MB.
# `start` copies hybridrl/, benchmarks/ and configs/ to ROOT/repo and runs from there, so that a checkout
# updated by a later call does not change a run under way. ROOT/status has one line per stage;
# ROOT/DONE appears after the last row.
# `wait` returns when the queue is done (exit 0) or after SECONDS (exit 3, still running), printing the
# status, the last step of the row in training and the evals' accuracies, and copies ROOT/*.tgz and the
# status into DEST (e.g. "$OUT").
# Environment, passed on to every row: BUDGET_S (600 here), MODE, GPUS, POOL, PARTIAL, STALENESS,
# TOOL_CONFIG, EVAL_ARGS (benchmarks/learning_table.sh) and TRAIN_ARGS (extra key=value overrides of
# every trained row, word-split).
set -euo pipefail
CMD=${1:?command: start|wait}
shift

status() { echo "[learning_queue $(date +%T)] $*" | tee -a "$ROOT/status"; }

stage() {  # STAGE NAME RECIPE MODEL [overrides...]: one learning_table.sh stage of row NAME, logged; rc=its status
  local st=$1 name=$2 recipe=$3 model=$4
  shift 4
  rc=0
  bash benchmarks/learning_table.sh "$st" "$recipe" "$model" "$DATA" "$ROOT/$name" "$@" >"$ROOT/$name.$st.log" 2>&1 || rc=$?
  status "$name: $st rc=$rc"
}

run_rows() {  # runs in the detached session: MODEL DATA ROOT ROW...
  local model=$1 row recipe name m
  DATA=$2 ROOT=$3
  shift 3
  cd "$ROOT/repo"
  for row in "$@"; do
    m=$model
    [[ $row == *=* ]] && m=${row#*=} && row=${row%%=*}
    if [[ $row == base:* ]]; then
      recipe=${row#base:} name=base_${row#base:}
      status "$name: start (model $m)"
      stage before "$name" "$recipe" "$m"
    else
      recipe=$row name=$row
      status "$name: train start (model $m, BUDGET_S=$BUDGET_S)"
      # shellcheck disable=SC2086  # TRAIN_ARGS is a list of overrides
      stage train "$name" "$recipe" "$m" ${TRAIN_ARGS:-}
      ((rc != 0)) || stage after "$name" "$recipe" "$m"
    fi
    bash benchmarks/learning_table.sh row "$recipe" "$m" "$DATA" "$ROOT/$name" >>"$ROOT/status" 2>&1 || status "$name: row failed"
    (cd "$ROOT" && tar czf "$name.tgz" --ignore-failed-read "$name/results" "$name".*.log 2>/dev/null) || true
    status "$name: done, $ROOT/$name.tgz"
  done
  status "all rows done"
  touch "$ROOT/DONE"
}

case $CMD in
  start)
    MODEL=$(realpath -e -- "${1:?model dir}") DATA=$(realpath -e -- "${2:?gsm8k dir}") ROOT=$(realpath -m -- "${3:?root dir}")
    shift 3
    (($# > 0)) || { echo "no rows: name at least one ROW (RECIPE or base:RECIPE)" >&2; exit 2; }
    cd "$(dirname "$0")/.."
    for row in "$@"; do  # every recipe and model before anything starts
      r=${row%%=*} r=${r#base:}
      python benchmarks/learning_table.py data-args "$r" >/dev/null
      [[ $row != *=* ]] || [[ -d ${row#*=} ]] || { echo "$row: ${row#*=} is not a directory" >&2; exit 2; }
    done
    if [[ -e $ROOT/status && ! -e $ROOT/DONE ]]; then
      echo "$ROOT holds a queue that has not finished ($ROOT/status): wait on it, or give another ROOT" >&2; exit 2
    fi
    mkdir -p "$ROOT"
    rm -rf "$ROOT/repo" "$ROOT/DONE" "$ROOT/status"
    mkdir "$ROOT/repo"
    cp -a hybridrl benchmarks configs "$ROOT/repo/"
    export ROOT BUDGET_S=${BUDGET_S:-600}
    # the first status line before `start` returns: a `wait` (or a second `start`) right after it must
    # find the queue (on 2026-11-29 `start && wait` on the GPU machine found no status yet)
    status "queued $# row(s): $*"
    setsid nohup bash "$ROOT/repo/benchmarks/learning_queue.sh" _run "$MODEL" "$DATA" "$ROOT" "$@" \
      >"$ROOT/queue.log" 2>&1 </dev/null &
    echo "started $# row(s) in $ROOT (pid $!): benchmarks/learning_queue.sh wait $ROOT SECONDS [DEST]" ;;
  _run) run_rows "$@" ;;
  wait)
    ROOT=$(realpath -m -- "${1:?root dir}") LIMIT=${2:?seconds} DEST=${3:-}
    [[ -e $ROOT/status ]] || { echo "$ROOT/status does not exist: start a queue there first" >&2; exit 2; }
    end=$((SECONDS + LIMIT))
    while ((SECONDS < end)) && [[ ! -e $ROOT/DONE ]]; do sleep 2; done
    tail -n 40 "$ROOT/status"
    for log in "$ROOT"/*.train.log; do
      [[ -e $log ]] && echo "$(basename "$log"): $(grep -E '^step [0-9]+' "$log" | tail -n 1 | cut -c1-300)"
    done
    grep -H "exactly right" "$ROOT"/*.after.log "$ROOT"/*.before.log 2>/dev/null || true
    if [[ -n $DEST ]]; then
      mkdir -p "$DEST"
      cp "$ROOT"/*.tgz "$DEST"/ 2>/dev/null || true
      cp "$ROOT/status" "$DEST/queue_status.txt"
    fi
    [[ -e $ROOT/DONE ]] || { echo "still running"; exit 3; } ;;
  *) echo "unknown command $CMD (start|wait)" >&2; exit 2 ;;
esac
