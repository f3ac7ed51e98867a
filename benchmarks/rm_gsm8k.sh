#!/usr/bin/env bash
# SFT-free RLHF on GSM8K with a learned reward model, on one GPU (docs/reward_models.md, "Recipe"):
#   1. sample N solutions per training question from the policy (hybridrl eval --n --temperature);
#   2. pair a correct and an incorrect solution of each question (hybridrl data rm-pairs); correct = the last
#      number is the answer (the base model rarely writes the strict `#### N`), and the logged rule score likewise;
#   3. train a reward model from the same model (algorithm.name=rm, Bradley-Terry), export it;
#   4. a few GRPO steps scored by the reward model alone (rule weight 0; the rule score is logged),
#      and the step-time breakdown with the reward model's share, as JSON in $OUT/rm_gsm8k.json.
#
#   bash benchmarks/rm_gsm8k.sh MODEL_DIR GSM8K_DIR OUT_DIR          # one H200: about 8 minutes
#   SMOKE=1 bash benchmarks/rm_gsm8k.sh hybridrl/assets/tiny-arith /work/shared/data/gsm8k /tmp/rm_smoke   # CPU, ~1 min
#
# MODEL_DIR: a local HF causal LM (e.g. Qwen2.5-Coder-0.5B-Instruct); GSM8K_DIR holds train.jsonl and test.jsonl
# (question/answer rows). Sizes can be changed with the environment variables below.
set -euo pipefail
MODEL=${1:?MODEL_DIR}; GSM8K=${2:?GSM8K_DIR with train.jsonl}; OUT=${3:?OUT_DIR}
mkdir -p "$OUT"
W=$(mktemp -d "${TMPDIR:-/tmp}/rm_gsm8k.XXXXXX")
if [[ "${SMOKE:-0}" == 1 ]]; then  # the same commands at toy sizes, on CPU, with a random-init tiny model
  DEVICE=cpu; ROLLOUT=hf; QUESTIONS=${QUESTIONS:-16}; N=${N:-4}; PLEN=${PLEN:-256}; RLEN=${RLEN:-8}; RM_STEPS=${RM_STEPS:-2}
  RM_BATCH=${RM_BATCH:-4}; RL_STEPS=${RL_STEPS:-2}; RL_BATCH=${RL_BATCH:-4}
  python - "$MODEL" "$W/model" <<'PY'
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
torch.manual_seed(0)  # MODEL may be a config-only directory: give it random weights
AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(sys.argv[1])).save_pretrained(sys.argv[2])
AutoTokenizer.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[2])
PY
  MODEL="$W/model"
else
  DEVICE=cuda; ROLLOUT=native; QUESTIONS=${QUESTIONS:-1024}; N=${N:-4}; PLEN=${PLEN:-512}; RLEN=${RLEN:-384}; RM_STEPS=${RM_STEPS:-40}
  RM_BATCH=${RM_BATCH:-32}; RL_STEPS=${RL_STEPS:-5}; RL_BATCH=${RL_BATCH:-64}
fi
T0=$(date +%s)
python -m hybridrl data gsm8k --input "$GSM8K/train.jsonl" --output "$W/train.parquet"

# 1-2. sampled solutions -> (correct, incorrect) pairs
python -m hybridrl eval --model "$MODEL" --data "$W/train.parquet" --limit "$QUESTIONS" --n "$N" --temperature 1.0 \
  --max-prompt-length "$PLEN" --max-response-length "$RLEN" --device "$DEVICE" --rollout "$ROLLOUT" --output "$W/samples.jsonl"
if [[ "${SMOKE:-0}" == 1 ]]; then  # a random model never solves GSM8K: give the toy run pairs to train on
  python - "$W/samples.jsonl" <<'PY'
import json, sys
rows = [json.loads(x) for x in open(sys.argv[1])]
for i, r in enumerate(rows):
    r["score"] = float(i % 2)
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
else  # the base model rarely writes verl's strict `#### N` (0.0% on the test set, BENCHMARKS.md): pair on the last number
  python - "$W/samples.jsonl" <<'PY'
import json, sys
from hybridrl.rewards import gsm8k
rows = [json.loads(x) for x in open(sys.argv[1])]
for r in rows:
    r["score"] = gsm8k.compute_score(r["response"], r["ground_truth"], method="flexible")
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
print(f"flexible-correct samples: {sum(r['score'] == 1.0 for r in rows)} of {len(rows)}")
PY
fi
python -m hybridrl data rm-pairs --input "$W/samples.jsonl" --output "$W/pairs.jsonl" --pairs-per-prompt 2
T1=$(date +%s)

# 3. the reward model (sequence classifier from the same checkpoint), exported for reward_model.model.path
COMMON=(trainer.device=$DEVICE trainer.n_gpus_per_node=1 "trainer.logger=[console,jsonl]" trainer.val_before_train=false
        data.max_prompt_length=$PLEN data.max_response_length=$((RLEN + 1)) data.truncation=left
        actor_rollout_ref.model.path=$MODEL actor_rollout_ref.actor.use_dynamic_bsz=true
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384)
python -m hybridrl train "${COMMON[@]}" algorithm.name=rm data.train_files="$W/pairs.jsonl" data.train_batch_size=$RM_BATCH \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$((RM_BATCH < 8 ? RM_BATCH : 8)) \
  actor_rollout_ref.actor.optim.lr=1e-5 trainer.total_training_steps=$RM_STEPS trainer.default_local_dir="$W/rm"
python -m hybridrl export "$W/rm" "$W/rm_hf"
T2=$(date +%s)

# 4. GRPO on the reward model's score alone (reward_model.rule_weight=0, verl's semantics)
python -m hybridrl train configs/gsm8k_grpo.yaml "${COMMON[@]}" data.train_files="$W/train.parquet" data.val_files=null \
  data.max_response_length=$RLEN data.train_batch_size=$RL_BATCH actor_rollout_ref.actor.ppo_mini_batch_size=$RL_BATCH \
  actor_rollout_ref.rollout.name=$ROLLOUT actor_rollout_ref.rollout.n=4 reward_model.enable=true \
  reward_model.model.path="$W/rm_hf" reward_model.use_dynamic_bsz=true reward_model.forward_max_token_len_per_gpu=32768 \
  custom_reward_function.reward_kwargs="{flexible_score: 1.0}" \
  trainer.total_training_steps=$RL_STEPS trainer.save_freq=-1 trainer.resume_mode=disable trainer.default_local_dir="$W/grpo"
T3=$(date +%s)

python - "$W" "$OUT" "$((T1 - T0))" "$((T2 - T1))" "$((T3 - T2))" <<'PY'
import json, sys
from pathlib import Path

w, out = Path(sys.argv[1]), Path(sys.argv[2])
rm = [json.loads(x) for x in (w / "rm" / "metrics.jsonl").read_text().splitlines()]
rl = [json.loads(x) for x in (w / "grpo" / "metrics.jsonl").read_text().splitlines() if "timing_s/step" in x]
steady = rl[1:] or rl  # the first step pays one-time costs (CUDA graphs, allocator)
stages = sorted({k for r in steady for k in r if k.startswith("timing_s/") and k != "timing_s/step"})
step = sum(r["timing_s/step"] for r in steady) / len(steady)
breakdown = {k.removeprefix("timing_s/"): sum(r.get(k, 0.0) for r in steady) / len(steady) for k in stages}
result = {
    "pairs": sum(1 for _ in open(w / "pairs.jsonl")),
    "wall_s": {"sample_and_pair": float(sys.argv[3]), "train_rm": float(sys.argv[4]), "grpo": float(sys.argv[5])},
    "rm_train": {k: rm[-1].get(k) for k in ("rm/loss", "rm/accuracy", "rm/margin_mean")},
    "rm_train_first": {k: rm[0].get(k) for k in ("rm/loss", "rm/accuracy", "rm/margin_mean")},
    "grpo_steps": len(rl),
    "step_s_mean": step,
    "breakdown_s": breakdown,
    "reward_model_share": breakdown.get("reward_model", 0.0) / step,
    "rm_score": [r.get("reward_model/score/mean") for r in rl],
    "rule_score": [r.get("reward_model/rule_score/mean") for r in rl],
}
(out / "rm_gsm8k.json").write_text(json.dumps(result, indent=2) + "\n")
print(f"step {step:.2f}s (steps 2..{len(rl)}): " + ", ".join(f"{k} {v:.2f}s" for k, v in breakdown.items()))
print(f"reward model: {100 * result['reward_model_share']:.1f}% of the step; RM score {result['rm_score']}; "
      f"rule score {result['rule_score']}; wrote {out / 'rm_gsm8k.json'}")
PY
