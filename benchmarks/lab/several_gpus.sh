#!/usr/bin/env bash
# The several-GPU measurements of issues 40 and 41, each PART sized to one device call (10 minutes):
# every run has its own time limit, results are packed into OUT/PART.tgz plus OUT/PART.md (the
# tables), so a run cut short still leaves what finished. Needs Ray (carried as a wheel, ../shared/GPU.md).
#   bash benchmarks/lab/several_gpus.sh PART GSM8K_TRAIN_JSONL OUT
# Measured start-up on 2 H200s (2026-11-28): a 0.5B 2-GPU run spends ~56 s before its first
# generation and ~78 s in its first step (compilation, graph capture); a 1-GPU run about half.
# PART:
#   s05, s15   weak scaling 1 -> 2 GPUs of Qwen2.5-0.5B / 1.5B shapes: 1 GPU, 2 GPUs FSDP2
#              (fsdp_size=-1), 2 GPUs replicated (fsdp_size=1), the packed recipe, 4 steps each
#   trace05    the 2-GPU 0.5B runs again with step 3 profiled (benchmarks/trace_summary.py tables)
#   longtail2  the long-tail workload on 2 GPUs: sync colocated, one_step_off and async (partial
#              rollouts) with one rollout GPU of their own
#   push       benchmarks/weight_push.py, 1 trainer GPU -> 1 rollout GPU, 0.5B / 1.5B / 7B shapes,
#              host against device staging
# On CPU, a smoke run of a part (tiny model, gloo workers): SMOKE=1 SHAPES=tiny bash benchmarks/lab/several_gpus.sh s05 G OUT
set -uo pipefail
PART=${1:?PART}; G=${2:?GSM8K train.jsonl}; OUT=${3:?out dir}
HERE=$(cd "$(dirname "$0")/.." && pwd)  # benchmarks/: the scripts this runs
W=${WORK:-/tmp/several_gpus}/$PART
A=actor_rollout_ref.actor.fsdp_config
mkdir -p "$OUT" "$W"
limited() {  # limited SECONDS NAME command...: the run's output in W/NAME.out, its status in W/NAME.rc
  local s=$1 name=$2; shift 2
  timeout "$s" "$@" >"$W/$name.out" 2>&1; local rc=$?
  echo "$rc" >"$W/$name.rc"; echo "[several_gpus] $name: exit $rc ($( [ "$rc" = 124 ] && echo "cut at ${s}s" || echo done))" >&2
}
export STEPS=${STEPS:-4}
case "$PART" in
  s05 | s15)
    if [ "$PART" = s05 ]; then S=qwen2.5-0.5b; else S=qwen2.5-1.5b; fi
    export SHAPES=${SHAPES:-$S}
    limited 150 one bash "$HERE/scaling.sh" "$G" "$W/one" 1
    limited 200 fsdp bash "$HERE/scaling.sh" "$G" "$W/fsdp" 2
    EXTRA="$A.fsdp_size=1" limited 200 replicated bash "$HERE/scaling.sh" "$G" "$W/replicated" 2
    for d in fsdp replicated; do
      [ -f "$W/$d/grpo_2gpu.jsonl" ] && [ -f "$W/one/grpo_1gpu.jsonl" ] &&
        { echo "## $PART, 2 GPUs: $d"; python "$HERE/scaling_table.py" "$W/$d" 2 --baseline "$W/one/grpo_1gpu.jsonl"; echo; }
    done >"$OUT/$PART.md"
    ;;
  trace05)
    export SHAPES=${SHAPES:-qwen2.5-0.5b} PROFILE_STEP=3
    limited 220 fsdp bash "$HERE/scaling.sh" "$G" "$W/fsdp" 2
    EXTRA="$A.fsdp_size=1" limited 220 replicated bash "$HERE/scaling.sh" "$G" "$W/replicated" 2
    cat "$W"/*/grpo_2gpu.trace.md >"$OUT/$PART.md" 2>/dev/null
    ;;
  longtail2)
    export WORKLOAD=longtail
    limited 200 sync bash "$HERE/scaling.sh" "$G" "$W/lt" 2
    MODES=one_step_off limited 170 one_step_off bash "$HERE/scaling.sh" "$G" "$W/lt" 2
    MODES=async PARTIAL=${PARTIAL:-1} limited 170 async bash "$HERE/scaling.sh" "$G" "$W/lt" 2
    python "$HERE/scaling_table.py" "$W/lt" 2 --modes sync one_step_off async >"$OUT/$PART.md"
    ;;
  push)
    limited 540 push env PYTHONPATH="$HERE/..:${PYTHONPATH:-}" python "$HERE/weight_push.py" --trainer-ranks 1 --rollout-ranks 1 --out "$W/push" ${SMOKE:+--smoke}
    cp "$W/push.out" "$OUT/$PART.md"
    ;;
  *) echo "PART=$PART: one of s05, s15, trace05, longtail2, push" >&2; exit 2 ;;
esac
(cd "$W" && find . \( -name '*.jsonl' -o -name '*.md' -o -name '*.out' -o -name '*.rc' -o -name '*.json' \) \
  -not -path '*/runs/*' -size -4M -print0 | tar czf "$OUT/$PART.tgz" --null -T -)
cat "$OUT/$PART.md" 2>/dev/null
