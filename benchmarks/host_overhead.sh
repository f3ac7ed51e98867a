#!/usr/bin/env bash
# Is the GPU the bottleneck (issue 49)? The one-GPU GRPO step of benchmarks/scaling.sh (packed
# recipe, Qwen2.5-0.5B shapes, random weights) for each trainer.cpu_threads value in THREADS,
# alone and beside NEIGHBOURS, with one profiled step each; then per stage: wall, the GPU-busy
# share, and where the host's time went (benchmarks/trace_summary.py --host).
#   bash benchmarks/host_overhead.sh GSM8K_TRAIN_JSONL OUT_DIR
# Environment:
#   THREADS      trainer.cpu_threads values to compare (default "-1 0": torch's default, auto)
#   NEIGHBOURS   neighbour counts (default "0 2")
#   NEIGHBOUR    job: each neighbour is the same GRPO job on a GPU of its own (CUDA_VISIBLE_DEVICES=1..N;
#                needs N+1 GPUs), started with the measured run; cpu: a process spinning on one core
#                each (a stand-in where the GPUs are too few). Default: job when the GPUs suffice, else cpu.
#   STEPS (6), PROFILE_STEP (4: profiled, and left out of the medians), SHAPES, and every other variable of benchmarks/scaling.sh.
#   On CPU, a smoke run of the script: SMOKE=1 bash benchmarks/host_overhead.sh G OUT
set -euo pipefail
GSM8K=${1:?GSM8K train.jsonl}; OUT=${2:?output dir}
HERE=$(cd "$(dirname "$0")" && pwd)
THREADS=${THREADS:-"-1 0"}; NEIGHBOURS=${NEIGHBOURS:-"0 2"}
export STEPS=${STEPS:-6} PROFILE_STEP=${PROFILE_STEP:-4}
mkdir -p "$OUT"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
burners=()
stop_neighbours() {
  for p in "${burners[@]}"; do kill -- "-$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  burners=()
}
trap stop_neighbours EXIT
trap "stop_neighbours; exit 143" TERM INT
for n in $NEIGHBOURS; do
  kind=${NEIGHBOUR:-$([ "$gpus" -gt "$n" ] && echo job || echo cpu)}
  for t in $THREADS; do
    name="threads${t}_n${n}${kind:0:1}"
    echo "[host_overhead] $name: trainer.cpu_threads=$t beside $n $kind neighbour(s)" >&2
    for ((i = 1; i <= n; i++)); do
      if [ "$n" = 0 ]; then break; fi
      if [ "$kind" = job ]; then  # the same job, longer, on its own GPU
        CUDA_VISIBLE_DEVICES=$i STEPS=$((STEPS + 6)) PROFILE_STEP="" EXTRA="${EXTRA:-} trainer.cpu_threads=$t" \
          setsid bash "$HERE/scaling.sh" "$GSM8K" "$OUT/neighbour$i" 1 >/dev/null 2>&1 &
      else
        setsid python -c "while True: pass" &
      fi
      burners+=($!)
    done
    EXTRA="${EXTRA:-} trainer.cpu_threads=$t" bash "$HERE/scaling.sh" "$GSM8K" "$OUT/$name" 1 >"$OUT/$name.out" 2>&1 ||
      { tail -n 20 "$OUT/$name.out" >&2; stop_neighbours; exit 1; }
    stop_neighbours
  done
done
python "$HERE/host_table.py" "$OUT" ${PROFILE_STEP:+--skip-step "$PROFILE_STEP"}
