#!/usr/bin/env bash
# Weak scaling of the GRPO loop: a Qwen2.5-0.5B-shaped model (random weights: speed depends on
# shapes) on GSM8K prompts, on 1, 2 and 4 GPUs with the same per-GPU batch (16 prompts x 4
# samples per GPU), colocated; then PPO (gae) on 2 GPUs colocated vs split (actor 1, critic 1).
# Needs Ray for more than one GPU. Prints the table for BENCHMARKS.md.
#   bash benchmarks/scaling.sh GSM8K_TRAIN_JSONL OUT_DIR [GPU_COUNTS, default "1 2 4"]
set -euo pipefail
GSM8K=${1:?GSM8K train.jsonl}; OUT=${2:?output dir}; COUNTS=${3:-1 2 4}
mkdir -p "$OUT"
python - <<'PY'
from hybridrl.models.tiny import write_tiny_model_dir
write_tiny_model_dir("/tmp/q05", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0)
PY
python -m hybridrl data gsm8k --input "$GSM8K" --output /tmp/gsm8k/train.parquet

run() {  # name n_gpus estimator [overrides...]
  local name=$1 n=$2 est=$3; shift 3
  python -m hybridrl train configs/quickstart.yaml actor_rollout_ref.model.path=/tmp/q05 \
    data.train_files=/tmp/gsm8k/train.parquet data.val_files=null warmup.steps=0 data.max_prompt_length=512 \
    data.truncation=left data.max_response_length=128 data.train_batch_size=$((16 * n)) \
    actor_rollout_ref.actor.ppo_mini_batch_size=$((8 * n)) actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.optim.lr=1e-6 critic.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    algorithm.adv_estimator="$est" trainer.device=cuda trainer.n_gpus_per_node="$n" trainer.total_training_steps=5 \
    trainer.save_freq=-1 trainer.logger=[console,jsonl] trainer.resume_mode=disable \
    trainer.default_local_dir=/tmp/runs/scaling_"$name" "$@"
  cp /tmp/runs/scaling_"$name"/metrics.jsonl "$OUT/$name.jsonl"
}
for n in $COUNTS; do run "grpo_${n}gpu" "$n" grpo; done
run gae_2gpu_colocated 2 gae
run gae_2gpu_split 2 gae resource_pool.actor_rollout_ref=1 resource_pool.critic=1

python - "$OUT" $COUNTS <<'PY'
import json, statistics, sys
from pathlib import Path

out, counts = Path(sys.argv[1]), [int(c) for c in sys.argv[2:]]

def summary(name, n):
    rows = [json.loads(x) for x in (out / f"{name}.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("step", 0) >= 2 and "timing_s/step" in r]  # step 1 warms up
    t = statistics.median(r["timing_s/step"] for r in steps)
    tokens = statistics.median(r["perf/total_num_tokens"] for r in steps)
    return t, tokens / t / n

print("| run | GPUs | step time (s, median of steps 2-5) | tokens/s per GPU | weak-scaling efficiency |")
print("| --- | --- | --- | --- | --- |")
base = None
for n in counts:
    t, per_gpu = summary(f"grpo_{n}gpu", n)
    base = base or per_gpu
    print(f"| GRPO colocated | {n} | {t:.2f} | {per_gpu:,.0f} | {per_gpu / base:.2f} |")
for name in ("gae_2gpu_colocated", "gae_2gpu_split"):
    t, per_gpu = summary(name, 2)
    print(f"| PPO (gae) {name.rsplit('_', 1)[1]} | 2 | {t:.2f} | {per_gpu:,.0f} | |")
PY
