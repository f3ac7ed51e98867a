"""What the trainer's mismatch metric (`training/rollout_probs_diff_mean`, `_max`) reads for bfloat16
numerics against an engine left at old weights: the evidence for the GPU alarm's level
(hybridrl/trainer/alarms.py, docs/observability.md "Alarms").

    python benchmarks/lab/stale_engine.py --model MODEL_DIR --gsm8k GSM8K_DIR/train.jsonl [--lr 2e-6] [--out FILE]

It samples PROMPTS x SAMPLES GSM8K responses at T = 1 from the model in float32 (theta_0), then prints:
- numerics: |p_bf16 - p_fp32| of those tokens, the same weights in bfloat16 and float32;
- stale k: |p_k - p_0| after k AdamW steps of a GRPO loss on those samples (reward 1 for the right
  `#### N`, 0.1 for a wrong one, else 0; advantages normalised per prompt; token-mean loss; clip 1.0),
  i.e. what the metric reads when the engine kept theta_0 while the trainer moved k steps on.
Each row: the mean, max and 99th percentile of |dp| and the drift, the mean of log p_0 - log p_k.
2026-11-29, Qwen2.5-Coder-0.5B-Instruct on 2 CPU cores (about 25 minutes): numerics mean 0.0030, max
0.086; stale k = 1, 2, 4, 8 at lr 2e-6: mean 0.011, 0.021, 0.039, 0.069 at drifts 0.008, 0.026,
0.084, 0.30 (6,072 tokens). The steps revisit the same 32 samples, so a step drifts more than one of
a real run (`actor/ppo_kl` near 1e-4 on GSM8K): the rows map drift to the metric, not steps to drift.
"""

from __future__ import annotations

import argparse
import json
import re
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

SUFFIX = ' Let\'s think step by step and output the final answer after "####".'  # hybridrl data gsm8k's


def sample(model, tok, rows: list[dict], n: int, max_new: int, seed: int) -> list[dict]:
    tok.padding_side = "left"
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": r["question"] + SUFFIX}], tokenize=False, add_generation_prompt=True)
        for r in rows
    ]
    enc = tok([p for p in prompts for _ in range(n)], return_tensors="pt", padding=True)
    stop = sorted({tok.eos_token_id, *([tok.convert_tokens_to_ids("<|im_end|>")] if "<|im_end|>" in tok.get_vocab() else [])})
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new, eos_token_id=stop,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else stop[0],
        )  # fmt: skip
    width, samples = enc["input_ids"].shape[1], []
    for i in range(out.shape[0]):
        resp = out[i, width:].tolist()
        cut = next((j + 1 for j, t in enumerate(resp) if t in stop), len(resp))  # keep the sampled stop token
        resp = resp[:cut]
        row = rows[i // n]
        samples.append({
            "prompt": i // n,
            "prompt_ids": enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist(),
            "response_ids": resp,
            "text": tok.decode(resp, skip_special_tokens=True),
            "truth": row["answer"].split("####")[-1].strip().replace(",", ""),
        })  # fmt: skip
    return samples


def token_log_probs(model, s: dict) -> torch.Tensor:
    ids = torch.tensor([s["prompt_ids"] + s["response_ids"]])
    r = len(s["response_ids"])
    logits = model(input_ids=ids, logits_to_keep=r + 1).logits[0, :r].float()
    return F.log_softmax(logits, dim=-1).gather(-1, torch.tensor(s["response_ids"]).unsqueeze(-1)).squeeze(-1)


def all_log_probs(model, samples: list[dict]) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([token_log_probs(model, s) for s in samples])


def reward(s: dict) -> float:
    if "####" not in s["text"]:
        return 0.0
    found = re.search(r"-?\d+(?:\.\d+)?", s["text"].split("####")[-1].replace(",", "").replace("$", ""))
    if found is None:
        return 0.0
    return 1.0 if abs(float(found.group()) - float(s["truth"])) < 1e-6 else 0.1


def row(name: str, lp_ref: torch.Tensor, lp: torch.Tensor) -> dict:
    dp = (lp.exp() - lp_ref.exp()).abs()
    return {"row": name, "mean": dp.mean().item(), "max": dp.max().item(), "p99": dp.quantile(0.99).item(),
            "drift": (lp_ref - lp).mean().item(), "tokens": dp.numel()}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--gsm8k", required=True, help="GSM8K train.jsonl (question/answer rows)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--lr", type=float, default=2e-6)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args()
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(a.model)
    with open(a.gsm8k) as f:
        rows = [json.loads(line) for line, _ in zip(f, range(a.prompts))]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    samples = sample(model, tok, rows, a.samples, a.max_new_tokens, a.seed)
    r = torch.tensor([reward(s) for s in samples]).view(-1, a.samples)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).view(-1).tolist()
    if not any(adv):
        raise SystemExit("every sample of every prompt scored the same: no gradient; use more --prompts or --samples")
    lp0 = all_log_probs(model, samples)
    out = [row("numerics: bfloat16 vs float32, theta_0", lp0, all_log_probs(model.to(torch.bfloat16), samples))]
    model.float()
    tokens = sum(len(s["response_ids"]) for s in samples)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), weight_decay=0.01)
    model.train()
    for k in range(1, a.steps + 1):
        opt.zero_grad(set_to_none=True)
        for s, adv_s in zip(samples, adv):
            if adv_s:
                (-(adv_s * token_log_probs(model, s)).sum() / tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if k & (k - 1) == 0:  # 1, 2, 4, 8, ...
            name = f"stale engine: theta_0 while the trainer is {k} step(s) on (lr {a.lr:g})"
            out.append(row(name, lp0, all_log_probs(model, samples)))
        print(f"[{time.time() - t0:6.0f}s] step {k}", flush=True)
    print("| row | mean \\|dp\\| | max | p99 | drift (nats) | tokens |\n| --- | --- | --- | --- | --- | --- |")
    for o in out:
        print(f"| {o['row']} | {o['mean']:.4f} | {o['max']:.3f} | {o['p99']:.3f} | {o['drift']:.4f} | {o['tokens']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
