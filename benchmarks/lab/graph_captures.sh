#!/usr/bin/env bash
# CUDA-graph re-captures per GRPO step with and without the engine's allocator default (rollout/native/cache.py):
# random-weight Qwen2.5-0.5B shapes, GSM8K prompts (char tokenizer), 32 x 16 samples of 128 tokens, 8 steps.
#   bash benchmarks/lab/graph_captures.sh GSM8K_DIR   (GSM8K_DIR holds train.jsonl)
set -euo pipefail
GSM8K=${1:?gsm8k dir}
python3 -c "
from hybridrl.models.tiny import write_tiny_model_dir
write_tiny_model_dir('/tmp/q05', hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
  intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0)"
mkdir -p /tmp/gd && python3 -m hybridrl data gsm8k --input "$GSM8K/train.jsonl" --output /tmp/gd/train.parquet > /dev/null
for alloc in unset ""; do
  if [ "$alloc" = unset ]; then unset PYTORCH_CUDA_ALLOC_CONF; else export PYTORCH_CUDA_ALLOC_CONF=$alloc; fi
  python3 -m hybridrl train configs/gsm8k_grpo.yaml actor_rollout_ref.model.path=/tmp/q05 \
    actor_rollout_ref.model.random_init=true data.train_files=/tmp/gd/train.parquet data.val_files=null data.max_response_length=128 \
    data.train_batch_size=32 actor_rollout_ref.rollout.n=16 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 trainer.total_training_steps=8 trainer.logger=[jsonl] \
    trainer.save_freq=-1 trainer.default_local_dir=/tmp/cap_$RANDOM > /tmp/cap.log 2>&1 || tail -20 /tmp/cap.log
  python3 -c "
import json,glob,os
f=max(glob.glob('/tmp/cap_*/metrics.jsonl'), key=os.path.getmtime)
for l in open(f):
    r=json.loads(l)
    if 'timing_s/gen' in r: print('alloc=$alloc', r['step'], 'step_s', round(r['timing_s/step'],3), 'gen', round(r['timing_s/gen'],3), 'captures', r.get('rollout/graph_captures'), 'capture_s', round(r.get('rollout/graph_capture_s',0),3), 'decode_ms', round(r['rollout/decode_ms_per_step'],3), 'steps', r['rollout/decode_steps'])
"
done
