"""Dequantize a GGUF checkpoint into a plain bf16 Hugging Face directory (for the GPU machine,
where the compact GGUF is what travels: ../shared/GPU.md; ../shared/tools/get_models.sh does the
same where the package index is reachable).

    python benchmarks/lab/gguf_to_hf.py MODEL.gguf OUT_DIR      (needs the gguf package)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(gguf: str, out: str) -> None:
    src, name = str(Path(gguf).parent), Path(gguf).name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    kw = {}
    try:  # newer transformers keep a GGUF quantizer attached unless told to dequantize
        from transformers import GgufConfig

        kw["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.bfloat16, **kw)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    print(f"wrote {out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, tokenizer of {len(tok)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
