#!/usr/bin/env bash
# Weak scaling of the GRPO loop: a Qwen2.5-0.5B- or 1.5B-shaped model (random weights: speed
# depends on shapes) on GSM8K prompts, on 1, 2, 4 (, 8) GPUs with the same per-GPU batch (PROMPTS
# prompts x N samples x RESP tokens per GPU), colocated; then PPO (gae) on PPO_GPUS GPUs colocated
# vs split (actor + rollout + reference on SPLIT_ACTOR of them, the critic on the rest). Needs Ray
# for more than one GPU. Prints the table for BENCHMARKS.md.
#   bash benchmarks/scaling.sh GSM8K_TRAIN_JSONL OUT_DIR [GPU_COUNTS, default "1 2 4"]
#   the 8-GPU run: SHAPES=qwen2.5-1.5b PPO_GPUS=8 SPLIT_ACTOR=6 bash benchmarks/scaling.sh G OUT "1 2 4 8"
# Environment: SHAPES (qwen2.5-0.5b | qwen2.5-1.5b | tiny), PROMPTS (32), MICRO (16), N (8), RESP (256),
# STEPS (6), ROLLOUT (auto: native on GPU), PPO (1: also the PPO placement runs), PPO_GPUS (2),
# SPLIT_ACTOR (PPO_GPUS / 2), EXTRA (more overrides for every run), DEVICE (cuda; cpu with
# SHAPES=tiny dry-runs the script on worker processes).
set -euo pipefail
GSM8K=${1:?GSM8K train.jsonl}; OUT=${2:?output dir}; COUNTS=${3:-1 2 4}
PROMPTS=${PROMPTS:-32}; MICRO=${MICRO:-16}; N=${N:-8}; RESP=${RESP:-256}; STEPS=${STEPS:-6}; DEVICE=${DEVICE:-cuda}; ROLLOUT=${ROLLOUT:-auto}; PPO=${PPO:-1}; EXTRA=${EXTRA:-}
PPO_GPUS=${PPO_GPUS:-2}; SPLIT_ACTOR=${SPLIT_ACTOR:-$((PPO_GPUS / 2))}
if (( SPLIT_ACTOR < 1 || SPLIT_ACTOR >= PPO_GPUS )); then
  echo "SPLIT_ACTOR=$SPLIT_ACTOR must leave at least one of PPO_GPUS=$PPO_GPUS GPUs to each side" >&2; exit 2
fi
mkdir -p "$OUT"
SHAPES=${SHAPES:-qwen2.5-0.5b} python - <<'PY'
import os
from hybridrl.models.tiny import write_tiny_model_dir
SHAPES = {  # Qwen2.5 architectures (their config.json values)
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960),
}
shape = os.environ["SHAPES"]
if shape == "tiny":
    write_tiny_model_dir("/tmp/q05")
elif shape in SHAPES:
    write_tiny_model_dir("/tmp/q05", **SHAPES[shape], vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0)
else:
    raise SystemExit(f"SHAPES={shape!r}: one of tiny, {', '.join(SHAPES)}")
PY
python -m hybridrl data gsm8k --input "$GSM8K" --output /tmp/gsm8k/train.parquet

run() {  # name n_gpus estimator [overrides...]
  local name=$1 n=$2 est=$3; shift 3
  python -m hybridrl train configs/quickstart.yaml actor_rollout_ref.model.path=/tmp/q05 actor_rollout_ref.model.random_init=true actor_rollout_ref.rollout.name=$ROLLOUT \
    data.train_files=/tmp/gsm8k/train.parquet data.val_files=null warmup.steps=0 data.max_prompt_length=512 \
    data.truncation=left data.max_response_length=$RESP data.train_batch_size=$((PROMPTS * n)) \
    actor_rollout_ref.actor.ppo_mini_batch_size=$((PROMPTS / 2 * n)) actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$MICRO \
    actor_rollout_ref.rollout.n=$N actor_rollout_ref.actor.optim.lr=1e-6 critic.ppo_micro_batch_size_per_gpu=$MICRO \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=$((2 * MICRO)) actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=$((2 * MICRO)) \
    algorithm.adv_estimator="$est" trainer.device=$DEVICE trainer.n_gpus_per_node="$n" trainer.total_training_steps=$STEPS \
    trainer.save_freq=-1 trainer.logger=[console,jsonl] trainer.resume_mode=disable \
    trainer.default_local_dir=/tmp/runs/scaling_"$name" $EXTRA "$@"
  cp /tmp/runs/scaling_"$name"/metrics.jsonl "$OUT/$name.jsonl"
}
for n in $COUNTS; do run "grpo_${n}gpu" "$n" grpo; done
if [ "$PPO" = 1 ]; then
  run gae_colocated "$PPO_GPUS" gae
  run gae_split "$PPO_GPUS" gae resource_pool.actor_rollout_ref="$SPLIT_ACTOR" resource_pool.critic=$((PPO_GPUS - SPLIT_ACTOR))
fi

PPO_GPUS=$PPO_GPUS SPLIT_ACTOR=$SPLIT_ACTOR python - "$OUT" $COUNTS <<'PY'
import os
import json, statistics, sys
from pathlib import Path

out, counts = Path(sys.argv[1]), [int(c) for c in sys.argv[2:]]

def summary(name, n):
    rows = [json.loads(x) for x in (out / f"{name}.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 2 and "timing_s/step" in r]  # step 1 warms up
    med = {k: statistics.median(r.get(k, 0.0) for r in steps) for k in KEYS}
    return med, med["perf/total_num_tokens"] / med["timing_s/step"] / n

KEYS = ["timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/values",
        "timing_s/update_critic", "timing_s/update_actor", "perf/total_num_tokens"]
cols = " | ".join(k.split("/")[1] for k in KEYS[1:-1])
print(f"| run | GPUs | step (s, median of steps 2+) | {cols} | tokens/s per GPU | weak-scaling efficiency |")
print("| --- | --- | --- | " + "--- | " * (len(KEYS) - 2) + "--- | --- |")
base = None

def row(label, n, med, per_gpu, eff):
    parts = " | ".join(f"{med[k]:.2f}" for k in KEYS[1:-1])
    print(f"| {label} | {n} | {med['timing_s/step']:.2f} | {parts} | {per_gpu:,.0f} | {eff} |")

for n in counts:
    med, per_gpu = summary(f"grpo_{n}gpu", n)
    base = base or per_gpu
    row("GRPO colocated", n, med, per_gpu, f"{per_gpu / base:.2f}")
g, a = int(os.environ["PPO_GPUS"]), int(os.environ["SPLIT_ACTOR"])
for name, label in (("gae_colocated", "PPO (gae) colocated"), ("gae_split", f"PPO (gae) split {a} + {g - a}")):
    if not (out / f"{name}.jsonl").exists():
        continue
    med, per_gpu = summary(name, g)
    row(label, g, med, per_gpu, "")
PY
