"""What n-gram speculative decoding would save on a GRPO rollout's decode steps: an exact simulation.

A decode step of a batch lasts as long as its longest sequence runs, so a GRPO rollout of 512
samples takes as many steps as its longest response (often the 512-token limit) while most rows
have long finished. Speculative decoding would shorten exactly those tails. With exact-match
verification and a sampler whose noise is a function of (sequence seed, position), as the native
engine's is, a speculative step reproduces the tokens of plain decoding: a drafted token is kept
when it equals the token the target model samples at its position, and the verification samples
one token itself. So the tokens of a plain rollout determine the steps speculative decoding would
take. This script replays them: at each step it drafts up to --draft tokens by prompt lookup (the
last --ngram .. 1 tokens of prompt + response so far, found at their latest earlier occurrence;
the tokens that followed it), keeps the longest prefix that matches the real continuation, and adds
the verification's own token.

Reported: per-row plain and speculative steps, the batch's steps both ways (the longest row), the
accepted draft tokens per step, and the token positions the verification passes would compute
(rows still running x (draft + 1)) against plain decoding's (rows still running). It does not time
anything: a verification step of few rows costs about a decode step, since both are bound by
reading the weights, but that is for the GPU to show.

Command: PYTHONPATH=. python benchmarks/spec_tail.py --model DIR --data gsm8k/train.parquet \\
             --prompts 8 --n 16 --max-new 512 --out OUT      (generates with the native engine)
         PYTHONPATH=. python benchmarks/spec_tail.py --tokens OUT/rollout.json --out OUT  (replays a rollout)
CPU smoke test: PYTHONPATH=. python benchmarks/spec_tail.py --tiny --out OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch


def draft(ctx: list[int], index: list[dict], k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of ctx's longest indexed suffix.
    `index[n-1]` maps each n-gram to the end of its latest occurrence before the current end."""
    for n in range(len(index), 0, -1):
        if len(ctx) < n:
            continue
        end = index[n - 1].get(tuple(ctx[-n:]))
        if end is not None:
            return ctx[end : end + k]
    return []


def spec_steps(prompt: list[int], response: list[int], k: int, ngram: int) -> tuple[int, int]:
    """(decode steps, drafted tokens accepted) of exact-match speculative decoding with prompt
    lookup over `response`; plain decoding takes len(response) steps."""
    ctx = list(prompt)
    index: list[dict] = [{} for _ in range(ngram)]
    indexed = 0  # n-grams ending at positions < indexed are in the index

    def extend_index(upto: int) -> None:
        nonlocal indexed
        for end in range(max(indexed, 1), upto):
            for n in range(1, ngram + 1):
                if end >= n:
                    index[n - 1][tuple(ctx[end - n : end])] = end
        indexed = max(indexed, upto)

    i = steps = accepted = 0
    while i < len(response):
        extend_index(len(ctx))  # every n-gram ending before the current suffix's own end
        proposal = draft(ctx, index, k)
        a = 0
        while a < len(proposal) and i + a < len(response) and proposal[a] == response[i + a]:
            a += 1
        advance = min(a + 1, len(response) - i)
        ctx.extend(response[i : i + advance])
        i += advance
        steps += 1
        accepted += min(a, advance)
    return steps, accepted


def replay(prompts: list[list[int]], responses: list[list[int]], k: int, ngram: int) -> dict:
    rows = [spec_steps(p, r, k, ngram) for p, r in zip(prompts, responses)]
    plain = [len(r) for r in responses]
    spec = [s for s, _ in rows]
    long_rows = [i for i, n in enumerate(plain) if n >= 0.9 * max(plain)]

    def positions(steps_per_row: list[int], width: int) -> int:  # rows still running, summed over steps
        return sum(s * width for s in steps_per_row)

    return {
        "draft": k,
        "ngram": ngram,
        "rows": len(responses),
        "batch_steps_plain": max(plain),
        "batch_steps_spec": max(spec),
        "mean_response": statistics.mean(plain),
        "accepted_per_step": sum(a for _, a in rows) / max(sum(spec), 1),
        "long_rows": len(long_rows),
        "long_rows_plain_steps": [plain[i] for i in long_rows],
        "long_rows_spec_steps": [spec[i] for i in long_rows],
        "positions_plain": positions(plain, 1),
        "positions_spec": positions(spec, k + 1),
        "per_row": [{"plain": p, "spec": s, "accepted": a} for p, (s, a) in zip(plain, rows)],
    }


def generate(a: argparse.Namespace) -> dict:
    """A plain rollout of the real model (or the tiny one) with the native engine: token ids."""
    from hybridrl.data import keys as K
    from hybridrl.data.dataset import collate_prompts, load_prompt_records
    from hybridrl.models.loading import load_tokenizer
    from hybridrl.rollout import SamplingParams
    from hybridrl.rollout.native.engine import NativeRolloutEngine

    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.tiny:
        from hybridrl.data.converters import make_arith

        model_dir = Path(tempfile.mkdtemp()) / "model"
        from hybridrl.models.tiny import write_tiny_model_dir

        write_tiny_model_dir(model_dir, hidden_size=64, num_hidden_layers=2)
        data = make_arith(Path(tempfile.mkdtemp()))["train"]
    else:
        model_dir, data = a.model, a.data
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(str(model_dir))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if a.tiny:
        from transformers import AutoConfig

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = model.to(device).eval()
    records = load_prompt_records(data, tok, max_prompt_length=1024, max_rows=a.prompts)
    prompts = collate_prompts(records, tok.pad_token_id, [str(i) for i in range(len(records))])
    engine = NativeRolloutEngine.from_hf_model(
        model, tok, device=device, dtype=dtype, max_model_len=1024 + a.max_new, max_num_seqs=max(a.prompts * a.n, 1)
    )
    torch.manual_seed(a.seed)
    t0 = time.perf_counter()
    out = engine.generate(prompts, SamplingParams(n=a.n, temperature=1.0, max_new_tokens=a.max_new))
    seconds = time.perf_counter() - t0
    lengths = out[K.RESPONSE_MASK].sum(-1).long().tolist()
    responses = [row[:n].tolist() for row, n in zip(out[K.RESPONSES], lengths)]
    prompt_ids = [records[i // a.n].prompt_ids for i in range(len(responses))]
    return {"model": str(model_dir), "device": str(device), "seconds": seconds, "prompts": prompt_ids, "responses": responses}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="HF model directory (generates a rollout)")
    p.add_argument("--data", help="prompt rows (verl parquet/JSONL), e.g. GSM8K's train split")
    p.add_argument("--tokens", help="replay the rollout.json of an earlier run instead of generating")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.add_argument("--drafts", type=int, nargs="+", default=[2, 4, 8], help="draft lengths to replay")
    p.add_argument("--ngram", type=int, default=3, help="longest suffix looked up")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: a tiny random model, arithmetic prompts")
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.tiny:
        a.prompts, a.n, a.max_new, a.device = 2, 4, 16, "cpu"
    if a.tokens:
        rollout = json.loads(Path(a.tokens).read_text())
    elif a.model or a.tiny:
        rollout = generate(a)
    else:
        p.error("give --model and --data (generate), --tokens (replay) or --tiny")
    results = [replay(rollout["prompts"], rollout["responses"], k, a.ngram) for k in a.drafts]
    for r in results:
        print(
            f"draft {r['draft']}: batch steps {r['batch_steps_plain']} -> {r['batch_steps_spec']}, "
            f"{r['accepted_per_step']:.2f} drafted tokens kept per step; rows >= 90% of the longest: {r['long_rows']}, "
            f"their steps {r['long_rows_plain_steps']} -> {r['long_rows_spec_steps']}; "
            f"positions computed {r['positions_plain']} -> {r['positions_spec']}",
            flush=True,
        )
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        if not a.tokens:
            (out / "rollout.json").write_text(json.dumps(rollout))
        summary = [{k: v for k, v in r.items() if k != "per_row"} for r in results]
        (out / "spec_tail.json").write_text(json.dumps({"summary": summary, "results": results}, indent=1))


if __name__ == "__main__":
    main()
