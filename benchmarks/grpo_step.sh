#!/usr/bin/env bash
# The GRPO step of the GSM8K recipe's run 3 (BENCHMARKS.md: 32 prompts x 16 samples, mini-batches of
# 16 prompts, responses <= 512 tokens, KL loss) for STEPS steps (default 20) on one GPU, then the median
# stage times over steps 3..STEPS. The update's token budget is the recipe's (24,576: it peaks at ~43 GB
# on an 80 GB H100; the runs before 2026-11-27 set 16,384 here). Variants are overrides:
#   bash benchmarks/grpo_step.sh MODEL_DIR GSM8K_DIR OUT NAME [key=value ...]
# e.g. NAME=unshared actor_rollout_ref.model.share_prompts=false actor_rollout_ref.rollout.max_num_seqs=256
set -euo pipefail
MODEL=${1:?model dir}; DATA=${2:?gsm8k dir}; OUT=${3:?out dir}; NAME=${4:?variant name}; shift 4
mkdir -p "$OUT" && rm -rf "${OUT:?}/$NAME"
bash "$(dirname "$0")/gsm8k_grpo.sh" train "$MODEL" "$DATA" "$OUT" data.train_batch_size=32 actor_rollout_ref.rollout.n=16 \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 \
  custom_reward_function.reward_kwargs="{format_score: 0.1, format_needs_work: true, flexible_score: 0.2}" \
  trainer.total_training_steps="${STEPS:-20}" trainer.max_wall_time_s=1000 \
  trainer.logger=[jsonl] trainer.default_local_dir="$OUT/$NAME" trainer.log_samples=0 "$@" > "$OUT/$NAME.log" 2>&1
python3 - "$OUT/$NAME/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "timing_s/step" in r and r["step"] >= 3]
keys = ["timing_s/step", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
        "response_length/mean", "rollout/decode_steps", "rollout/decode_ms_per_step", "actor/shared_prompt_fraction", "perf/mfu/actor",
        "rollout/wake_s", "rollout/loop_s", "rollout/assemble_s", "rollout/sleep_s", "timing_s/update_weights"]
print(sys.argv[1], f"{len(rows)} steps, medians:")
for k in keys:
    vals = [r[k] for r in rows if k in r]
    if vals:
        print(f"  {k:32s} {statistics.median(vals):.4g}")
PY
