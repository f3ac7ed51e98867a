"""The native engine's prefill attention backends, A/B in one process (issue 49): a GRPO-shaped
generate call (PROMPTS prompts of random lengths, N samples each, NEW tokens, EOS ignored) with
SDPA's default choice (cuDNN first on Hopper) against flash attention first (the engine's
`PREFILL_BACKENDS`). Every repetition draws new prompt lengths, as a training step does, so each
prefill shape is new; both arms run the same prompts, alternating, after one warm-up call each.

    PYTHONPATH=. python benchmarks/lab/prefill_backends.py [--model Qwen2.5-0.5B] [--reps 6] [--out OUT]
    PYTHONPATH=. python benchmarks/lab/prefill_backends.py --tiny          # CPU smoke run

Prints, per arm: the median wall of a generate call, the median of its time outside decode steps
(the wall less `rollout/decode_steps` x `rollout/decode_ms_per_step`: the prefill passes with their
host work, and admission), and the tokens' digest of the last call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.rollout import MODELS, _Tok, hf_model  # noqa: E402
from hybridrl.data import keys as K  # noqa: E402
from hybridrl.data.batch import Batch  # noqa: E402
from hybridrl.rollout import SamplingParams  # noqa: E402
from hybridrl.rollout.native import attention  # noqa: E402
from hybridrl.rollout.native.engine import NativeRolloutEngine  # noqa: E402

ARMS = {
    "sdpa default (cuDNN first)": [
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ],
    "flash first (PREFILL_BACKENDS)": list(attention.PREFILL_BACKENDS),
}


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> Batch:
    """n left-padded prompts of random lengths in [lo, hi]."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (n,), generator=g)
    ids = torch.randint(2, vocab, (n, hi), generator=g)
    mask = (torch.arange(hi)[None] >= hi - lens[:, None]).long()
    return Batch({K.PROMPTS: ids * mask, K.PROMPT_MASK: mask}, {K.UID: [str(i) for i in range(n)]})


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(engine, batch, sampling) -> tuple[float, dict, str]:
    sync()
    t = time.perf_counter()
    out = engine.generate(batch, sampling, seeds=list(range(len(batch) * sampling.n)))  # same draws in both arms
    sync()
    digest = hashlib.sha256(out[K.RESPONSES].cpu().numpy().tobytes()).hexdigest()[:12]
    return time.perf_counter() - t, dict(engine.last_metrics), digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="Qwen2.5-0.5B", choices=sorted(MODELS))
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with the tiny config")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    name = "tiny" if args.tiny else args.model
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    if args.tiny:
        args.prompts, args.n, args.new, args.reps = 4, 2, 8, 2
    cfg = MODELS[name]
    trainer = hf_model(name, device)
    lo, hi = (4, 12) if args.tiny else (60, 300)  # GSM8K prompts under the chat template: ~60-300 tokens
    engine = NativeRolloutEngine(
        trainer.config,
        _Tok(cfg["eos_token_id"], cfg["pad_token_id"]),
        device=device,
        max_model_len=hi + args.new,
        max_num_seqs=args.prompts * args.n,
        gpu_memory_utilization=0.4,
        ignore_eos=True,
    )
    engine.load_weights(trainer.named_parameters())
    del trainer
    sampling = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new)
    walls: dict[str, list[float]] = {arm: [] for arm in ARMS}
    prefill: dict[str, list[float]] = {arm: [] for arm in ARMS}
    digests: dict[str, str] = {}
    for arm, backends in ARMS.items():  # warm-up: graph captures, first plans
        attention.PREFILL_BACKENDS = backends
        timed(engine, prompts(args.prompts, lo, hi, cfg["vocab_size"], seed=10_000), sampling)
    for rep in range(args.reps):
        batch = prompts(args.prompts, lo, hi, cfg["vocab_size"], seed=rep)
        for arm, backends in list(ARMS.items())[:: 1 if rep % 2 == 0 else -1]:  # alternate which arm goes first
            attention.PREFILL_BACKENDS = backends
            wall, metrics, digests[arm] = timed(engine, batch, sampling)
            walls[arm].append(wall)
            steps = metrics.get("rollout/decode_steps", 0.0)
            decode = metrics.get("rollout/decode_ms_per_step", 0.0) * steps / 1e3
            prefill[arm].append(wall - decode)
    rows = {
        arm: dict(wall_s=statistics.median(walls[arm]), prefill_s=statistics.median(prefill[arm]), tokens_sha256=digests[arm])
        for arm in ARMS
    }
    print(f"{name} on {device}: {args.prompts} prompts x {args.n} samples x {args.new} tokens, {args.reps} reps (medians)")
    print("| prefill attention | generate wall s | outside decode s | tokens sha256 (last rep) |\n| --- | --- | --- | --- |")
    for arm, r in rows.items():
        print(f"| {arm} | {r['wall_s']:.3f} | {r['prefill_s']:.3f} | {r['tokens_sha256']} |")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "prefill_backends.json").write_text(
            json.dumps(dict(model=name, device=str(device), rows=rows), indent=1)
        )


if __name__ == "__main__":
    main()
