#!/usr/bin/env bash
# End-to-end smoke of the fast-update defaults on a GPU: GRPO quickstart shape with packing,
# compiled layers and a KL reference; then LoRA + token budgets + a resume from the step-2 save.
#   bash benchmarks/gpu_smoke.sh OUT_DIR   (device cuda; prints the last metrics of each run)
set -euo pipefail
out=${1:-/tmp/hybridrl_gpu_smoke}
python -m hybridrl data arith --output "$out/data" > /dev/null
common=(data.train_files="$out/data/train.jsonl" data.val_files="$out/data/test.jsonl" warmup.files="$out/data/sft.jsonl"
        warmup.steps=20 trainer.device=cuda trainer.logger=[console,jsonl] trainer.test_freq=-1 trainer.val_before_train=false)
python -m hybridrl train configs/quickstart.yaml "${common[@]}" trainer.total_training_steps=3 trainer.save_freq=-1 \
  trainer.default_local_dir="$out/full"
lora=(actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.actor.use_dynamic_bsz=true
      actor_rollout_ref.actor.ppo_max_token_len_per_gpu=64 trainer.total_training_steps=4 trainer.save_freq=2
      trainer.resume_mode=auto trainer.default_local_dir="$out/lora")
HYBRIDRL_KILL_AFTER_SAVE_STEP=2 python -m hybridrl train configs/quickstart.yaml "${common[@]}" "${lora[@]}" || true
python -m hybridrl train configs/quickstart.yaml "${common[@]}" "${lora[@]}"
python - "$out" <<'PY'
import json, sys
for run in ("full", "lora"):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{run}/metrics.jsonl")]
    last = rows[-1]
    keys = ["step", "actor/pg_loss", "actor/kl_loss", "actor/pad_fraction", "perf/mfu/actor",
            "perf/max_memory_allocated_gb", "training/rollout_probs_diff_mean", "training/rollout_probs_diff_max",
            "critic/score/mean", "timing_s/update_actor"]
    print(run, [r["step"] for r in rows], {k: last.get(k) for k in keys})
PY
