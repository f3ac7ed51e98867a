"""What compiling the decoder layers costs the first step with LoRA: the first reference pass (no_grad,
adapters off) and the first two updates (forward + backward, two packed lengths), timed, with the
number of graphs dynamo built, for full fine-tuning, peft's plain wrapping, and hybridrl's
(`hybridrl.models.lora.apply_lora`, whose embeddings' output requires grad under grad).

The GSM8K LoRA row's first step took 95 s against full fine-tuning's 35 s on an H200 (docs/learning.md);
this isolates the compile part of it. Each mode runs in a fresh process with empty inductor caches.

    python benchmarks/lora_compile.py                          # CPU, 2 small layers (a few minutes)
    python benchmarks/lora_compile.py --device cuda --real     # Qwen2.5-0.5B's shapes, random weights
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = ("full", "peft", "hybridrl")


def one(mode: str, device: str, real: bool, tokens: tuple[int, int]) -> dict:
    import torch
    from torch._dynamo.utils import counters
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = (
        dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
        if real
        else dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936 if real else 256, **shape)).to(device, dtype)
    if mode == "peft":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=32, lora_alpha=32, target_modules="all-linear", lora_dropout=0.0))
    elif mode == "hybridrl":
        from hybridrl.models.lora import apply_lora

        model = apply_lora(model, 32, 32, "all-linear")
    base = model if mode == "full" else model.get_base_model()
    for layer in base.get_decoder().layers:
        layer.compile(dynamic=True)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def ids(n):
        return torch.randint(0, model.config.vocab_size, (1, n), device=device)

    out = {"mode": mode}
    sync()
    t = time.perf_counter()
    with torch.no_grad():
        if mode == "full":
            model(input_ids=ids(tokens[0]), use_cache=False)
        else:
            with model.disable_adapter():
                model(input_ids=ids(tokens[0]), use_cache=False)
    sync()
    out["first reference pass s"] = time.perf_counter() - t
    for i, n in enumerate(tokens):
        t = time.perf_counter()
        model(input_ids=ids(n), use_cache=False).logits.float().mean().backward()
        sync()
        out[f"update {i + 1} s"] = time.perf_counter() - t
    out["graphs"] = counters["stats"]["unique_graphs"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--real", action="store_true", help="Qwen2.5-0.5B's shapes (24 layers) instead of 2 small layers")
    ap.add_argument("--tokens", type=int, nargs=2, default=(37, 53), metavar=("N1", "N2"))
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in this process
    a = ap.parse_args(argv)
    if a.mode:
        print(json.dumps(one(a.mode, a.device, a.real, tuple(a.tokens))))
        return 0
    rows = []
    for mode in MODES:
        with tempfile.TemporaryDirectory() as cache:
            env = {
                **os.environ,
                "TORCHINDUCTOR_CACHE_DIR": cache,
                "TORCHINDUCTOR_FX_GRAPH_CACHE": "0",
                "TORCHINDUCTOR_AUTOGRAD_CACHE": "0",
            }
            cmd = [sys.executable, __file__, "--mode", mode, "--device", a.device, "--tokens", *map(str, a.tokens)]
            done = subprocess.run(cmd + (["--real"] if a.real else []), env=env, capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"{mode}: exit {done.returncode}\n{done.stderr[-2000:]}")
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + " --- |" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
