#!/usr/bin/env bash
# Per-stage time of one GRPO / PPO step on one GPU with the v0.1 single-device path
# (HF `generate` rollout, bf16 autocast over fp32 weights), for a Qwen2.5-0.5B-shaped model with
# random weights (speed depends on shapes, not weights) on GSM8K prompts.
#   bash benchmarks/lab/step_breakdown.sh GSM8K_TRAIN_JSONL OUT_DIR
set -euo pipefail
GSM8K=${1:?GSM8K train.jsonl}; OUT=${2:?output dir}
mkdir -p "$OUT"
python - <<'PY'
from hybridrl.models.tiny import write_tiny_model_dir
write_tiny_model_dir("/tmp/q05", hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                     intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0)
PY
python -m hybridrl data gsm8k --input "$GSM8K" --output /tmp/gsm8k/train.parquet
for est in grpo gae; do
  python -m hybridrl train configs/quickstart.yaml actor_rollout_ref.model.path=/tmp/q05 data.train_files=/tmp/gsm8k/train.parquet \
    data.val_files=null warmup.steps=0 data.max_prompt_length=512 data.truncation=left data.max_response_length=128 \
    data.train_batch_size=32 actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.optim.lr=1e-6 critic.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    algorithm.adv_estimator=$est trainer.device=cuda trainer.total_training_steps=3 \
    trainer.logger=[console,jsonl] trainer.default_local_dir=/tmp/runs/q05_$est
  cp /tmp/runs/q05_$est/metrics.jsonl "$OUT/q05_$est.jsonl"
done
