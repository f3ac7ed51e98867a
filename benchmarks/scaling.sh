#!/usr/bin/env bash
# Weak scaling of the GRPO loop: a Qwen2.5-0.5B- or 1.5B-shaped model (random weights: speed
# depends on shapes) on GSM8K prompts, on 1, 2, 4 (, 8) GPUs with the same per-GPU batch (PROMPTS
# prompts x N samples x RESP tokens per GPU), colocated; then, with PPO=1, PPO (gae) on PPO_GPUS
# GPUs colocated vs split (actor + rollout + reference on SPLIT_ACTOR of them, the critic on the
# rest). The configuration is configs/gsm8k_grpo.yaml, the one users run: packed token-budget
# micro-batches (use_dynamic_bsz) and no separate old log-prob pass; PACKED=0 measures fixed
# micro-batches of MICRO instead. Needs Ray for more than one GPU. Ends with the whole table
# (benchmarks/scaling_table.py) for BENCHMARKS.md.
#   bash benchmarks/scaling.sh GSM8K_TRAIN_JSONL OUT_DIR [GPU_COUNTS, default "1 2 4"]
#   the 8-GPU run: SHAPES=qwen2.5-1.5b PPO=1 PPO_GPUS=8 SPLIT_ACTOR=6 bash benchmarks/scaling.sh G OUT "1 2 4 8"
#   the 7B run of issue 40 (1,024-token responses, TP=2 rollout replicas; drop EXTRA for TP=1):
#   SHAPES=qwen2.5-7b RESP=1024 EXTRA=actor_rollout_ref.rollout.tensor_model_parallel_size=2 bash benchmarks/scaling.sh G OUT "2 4"
#   on CPU, a smoke run of the script itself (tiny model, 1 and 2 gloo workers, 2 steps):
#   SMOKE=1 bash benchmarks/scaling.sh G OUT
# The long-tail workload (docs/async.md): WORKLOAD=longtail generates every response to a length
# drawn from actor_rollout_ref.rollout.forced_response_lengths (lognormal, median LT_MEDIAN=350,
# sigma LT_SIGMA=1.0, cut at RESP=4096; rollout/lengths.py), EOS ignored, on the same GSM8K prompts;
# MODES="sync one_step_off async" adds the off-policy modes at each GPU count, with POOL rollout
# GPUs of their own (default half of them; 0 = colocated; one GPU: colocated) and
# PARTIAL=1 for async_training.partial_rollout; the table then compares them with sync at equal GPUs.
#   WORKLOAD=longtail MODES="sync one_step_off async" bash benchmarks/scaling.sh G OUT "2 4"
#   SMOKE=1 WORKLOAD=longtail MODES="sync one_step_off" bash benchmarks/scaling.sh G OUT 1   # CPU
# Every run writes OUT_DIR/runs/<name> (removed first: the script reruns cleanly into the same
# OUT_DIR), OUT_DIR/<name>.jsonl (its metrics) and OUT_DIR/<name>.log (its output).
# Environment: SHAPES (qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-7b | tiny), PROMPTS (32), N (8), RESP (256), STEPS (6),
# PACKED (1), TOKENS (update token budget per GPU; default the config's), MICRO (16, with PACKED=0),
# ROLLOUT (auto: native on GPU), PPO (0), PPO_GPUS (2), SPLIT_ACTOR (PPO_GPUS / 2),
# EXTRA (more overrides for every run), DEVICE (cuda), WORKLOAD (gsm8k | longtail), MODES (sync),
# POOL, PARTIAL (0), STALENESS (2: async_training.max_staleness of async), LT_MEDIAN, LT_SIGMA, LT_SEED (0).
# BASELINE: efficiency against that run file instead of the smallest count here (a variant on 2 GPUs only:
#   EXTRA=actor_rollout_ref.actor.fsdp_config.fsdp_size=1 BASELINE=OUT1/grpo_1gpu.jsonl bash benchmarks/scaling.sh G OUT2 2).
# PROFILE_STEP: profile that step of every run and write OUT/<name>.trace.md (benchmarks/trace_summary.py:
# compute, NCCL, exposed NCCL and idle time per worker method and rank, and where the host's time went).
set -euo pipefail
GSM8K=${1:?GSM8K train.jsonl}; OUT=${2:?output dir}
WORKLOAD=${WORKLOAD:-gsm8k}; MODES=${MODES:-sync}
case "$WORKLOAD" in
  gsm8k) ;;
  longtail) if [ "${SMOKE:-0}" = 1 ]; then : "${RESP:=24}" "${LT_MEDIAN:=6}"; else : "${RESP:=4096}"; fi ;;
  *) echo "WORKLOAD=$WORKLOAD: one of gsm8k, longtail" >&2; exit 2 ;;
esac
for mode in $MODES; do
  case "$mode" in sync | one_step_off | async) ;; *) echo "MODES: $mode is not one of sync, one_step_off, async" >&2; exit 2 ;; esac
done
if [ "${SMOKE:-0}" = 1 ]; then
  : "${SHAPES:=tiny}" "${DEVICE:=cpu}" "${STEPS:=2}" "${PROMPTS:=2}" "${N:=2}" "${RESP:=8}" "${ROLLOUT:=hf}" "${MAXPROMPT:=256}"
  COUNTS=${3:-1 2}
else
  COUNTS=${3:-1 2 4}
fi
SHAPES=${SHAPES:-qwen2.5-0.5b}; PROMPTS=${PROMPTS:-32}; MICRO=${MICRO:-16}; N=${N:-8}; RESP=${RESP:-256}; STEPS=${STEPS:-6}
DEVICE=${DEVICE:-cuda}; ROLLOUT=${ROLLOUT:-auto}; PPO=${PPO:-0}; EXTRA=${EXTRA:-}; PACKED=${PACKED:-1}; TOKENS=${TOKENS:-}
MAXPROMPT=${MAXPROMPT:-512}
PPO_GPUS=${PPO_GPUS:-2}; SPLIT_ACTOR=${SPLIT_ACTOR:-$((PPO_GPUS / 2))}
if [ "$PPO" = 1 ] && (( SPLIT_ACTOR < 1 || SPLIT_ACTOR >= PPO_GPUS )); then
  echo "SPLIT_ACTOR=$SPLIT_ACTOR must leave at least one of PPO_GPUS=$PPO_GPUS GPUs to each side" >&2; exit 2
fi
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
MODEL=$OUT/model
SHAPES=$SHAPES python - "$MODEL" <<'PY'
import os, sys
from hybridrl.models.tiny import write_tiny_model_dir
SHAPES = {  # Qwen2.5 architectures (their config.json values)
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
}
shape = os.environ["SHAPES"]
if shape == "tiny":
    write_tiny_model_dir(sys.argv[1])
elif shape in SHAPES:
    write_tiny_model_dir(sys.argv[1], **{"vocab_size": 151936, **SHAPES[shape]}, max_position_embeddings=32768, rope_theta=1000000.0)
else:
    raise SystemExit(f"SHAPES={shape!r}: one of tiny, {', '.join(SHAPES)}")
PY
python -m hybridrl data gsm8k --input "$GSM8K" --output "$OUT/data/train.parquet" >/dev/null

if [ "$PACKED" = 1 ]; then  # the config's token budgets (use_dynamic_bsz); TOKENS overrides the update's
  BATCHING=(${TOKENS:+actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$TOKENS})
else
  BATCHING=(actor_rollout_ref.actor.use_dynamic_bsz=false actor_rollout_ref.actor.reuse_on_policy_log_prob=false
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$MICRO" critic.ppo_micro_batch_size_per_gpu="$MICRO"
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$((2 * MICRO))
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$((2 * MICRO)))
fi

[ -n "${PROFILE_STEP:-}" ] && EXTRA="$EXTRA trainer.profile_steps=[$PROFILE_STEP]"
WORK=()  # the workload's overrides
if [ "$WORKLOAD" = longtail ]; then
  LT=actor_rollout_ref.rollout.forced_response_lengths
  WORK=("$LT.distribution=lognormal" "$LT.median=${LT_MEDIAN:-350}" "$LT.sigma=${LT_SIGMA:-1.0}" "$LT.seed=${LT_SEED:-0}")
fi

run() {  # name n_gpus estimator [overrides...]
  local name=$1 n=$2 est=$3; shift 3
  local dir=$OUT/runs/$name
  rm -rf "$dir" "$OUT/$name.jsonl"  # this run's own previous output: a rerun starts clean
  echo "[scaling] $name: $n device(s), $STEPS steps -> $OUT/$name.log" >&2
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  if ! python -m hybridrl train configs/gsm8k_grpo.yaml actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.model.random_init=true \
    actor_rollout_ref.rollout.name="$ROLLOUT" data.train_files="$OUT/data/train.parquet" data.val_files=null \
    data.max_prompt_length="$MAXPROMPT" data.max_response_length="$RESP" data.train_batch_size=$((PROMPTS * n)) \
    actor_rollout_ref.actor.ppo_mini_batch_size=$((PROMPTS / 2 * n > 0 ? PROMPTS / 2 * n : n)) actor_rollout_ref.rollout.n="$N" \
    "${BATCHING[@]}" "${WORK[@]}" algorithm.adv_estimator="$est" trainer.device="$DEVICE" trainer.n_gpus_per_node="$n" \
    trainer.total_training_steps="$STEPS" trainer.save_freq=-1 trainer.test_freq=-1 trainer.val_before_train=false \
    trainer.logger=[console,jsonl] trainer.resume_mode=disable trainer.default_local_dir="$dir" $EXTRA "$@" >"$OUT/$name.log" 2>&1; then
    tail -n 30 "$OUT/$name.log" >&2; echo "[scaling] $name failed: $OUT/$name.log" >&2; exit 1
  fi
  cp "$dir/metrics.jsonl" "$OUT/$name.jsonl"
  if [ -n "${PROFILE_STEP:-}" ]; then  # where the profiled step's time went, per worker method and rank
    python "$HERE/trace_summary.py" "$dir/profile/step_$PROFILE_STEP" --host --json "$OUT/$name.trace.json" >"$OUT/$name.trace.md"
  fi
}
for n in $COUNTS; do
  for mode in $MODES; do
    if [ "$mode" = sync ]; then run "grpo_${n}gpu" "$n" grpo; continue; fi
    pool=${POOL:-$((n / 2))}  # rollout GPUs of their own; the actor takes the rest
    if [ "$pool" != 0 ] && [ "$pool" != auto ] && (( pool >= n )); then pool=0; fi
    ASYNC=(trainer.mode="$mode" async_training.max_staleness="${STALENESS:-2}")
    [ "${PARTIAL:-0}" = 1 ] && ASYNC+=(async_training.partial_rollout=true)
    if [ "$pool" = auto ]; then
      ASYNC+=(resource_pool.rollout=auto)
    elif [ "$pool" != 0 ]; then
      ASYNC+=(resource_pool.actor_rollout_ref=$((n - pool)) resource_pool.rollout="$pool")
    fi
    run "${mode}_${n}gpu_r${pool}" "$n" grpo "${ASYNC[@]}"
  done
done
PPO_ARGS=()
if [ "$PPO" = 1 ]; then
  run gae_colocated "$PPO_GPUS" gae
  run gae_split "$PPO_GPUS" gae resource_pool.actor_rollout_ref="$SPLIT_ACTOR" resource_pool.critic=$((PPO_GPUS - SPLIT_ACTOR))
  PPO_ARGS=(--ppo "$PPO_GPUS" "$SPLIT_ACTOR")
fi
# shellcheck disable=SC2086
python "$HERE/scaling_table.py" "$OUT" $COUNTS "${PPO_ARGS[@]}" --modes $MODES ${BASELINE:+--baseline "$BASELINE"}
