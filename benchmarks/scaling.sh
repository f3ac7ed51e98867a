#!/usr/bin/env bash
# Weak scaling of the GRPO loop: a Qwen2.5-0.5B-shaped model (random weights: speed depends on
# shapes) on GSM8K prompts, on 1, 2 and 4 GPUs with the same per-GPU batch (PROMPTS prompts x N
# samples x RESP tokens per GPU), colocated; then PPO (gae) on 2 GPUs colocated vs split (actor 1,
# critic 1). Needs Ray for more than one GPU. Prints the table for BENCHMARKS.md.
#   bash benchmarks/scaling.sh GSM8K_TRAIN_JSONL OUT_DIR [GPU_COUNTS, default "1 2 4"]
# Environment: PROMPTS (32), MICRO (16), N (8), RESP (256), STEPS (6), ROLLOUT (auto: native on GPU),
# PPO (1: also the PPO placement runs), EXTRA (more overrides for every run), DEVICE (cuda; cpu with
# SHAPES=tiny dry-runs the script on worker processes).
set -euo pipefail
GSM8K=${1:?GSM8K train.jsonl}; OUT=${2:?output dir}; COUNTS=${3:-1 2 4}
PROMPTS=${PROMPTS:-32}; MICRO=${MICRO:-16}; N=${N:-8}; RESP=${RESP:-256}; STEPS=${STEPS:-6}; DEVICE=${DEVICE:-cuda}; ROLLOUT=${ROLLOUT:-auto}; PPO=${PPO:-1}; EXTRA=${EXTRA:-}
mkdir -p "$OUT"
SHAPES=${SHAPES:-qwen2.5-0.5b} python - <<'PY'
import os
from hybridrl.models.tiny import write_tiny_model_dir
if os.environ["SHAPES"] == "tiny":
    write_tiny_model_dir("/tmp/q05")
else:
    write_tiny_model_dir("/tmp/q05", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0)
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
  run gae_2gpu_colocated 2 gae
  run gae_2gpu_split 2 gae resource_pool.actor_rollout_ref=1 resource_pool.critic=1
fi

python - "$OUT" $COUNTS <<'PY'
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
for name in ("gae_2gpu_colocated", "gae_2gpu_split"):
    if not (out / f"{name}.jsonl").exists():
        continue
    med, per_gpu = summary(name, 2)
    row(f"PPO (gae) {name.rsplit('_', 1)[1]}", 2, med, per_gpu, "")
PY
