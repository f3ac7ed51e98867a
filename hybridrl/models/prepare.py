"""Getting a loaded model ready for fast passes: activation checkpointing, the packed-attention
hook, and torch.compile of the decoder layers (and turning the compiled layers off again)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from hybridrl.models.packing import base_model, enable_packing


def prepare_model(model, device: torch.device, *, remove_padding: bool, attn_backend: str = "auto",
                  checkpointing: bool = False, compile_layers: bool = False) -> str | None:  # fmt: skip
    """Returns the packed-attention backend, or None when the model's passes stay padded.
    Compilation applies on CUDA only (on CPU it costs more than it saves for the models run there)."""
    if checkpointing:
        # Non-reentrant: recomputation sees the same kwargs (the packed row's boundaries), and
        # it works when the inputs do not require grad (LoRA's frozen embeddings).
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    backend = enable_packing(model, attn_backend, device) if remove_padding else None
    if compile_layers and device.type == "cuda":
        compile_decoder_layers(model)
    return backend


def compile_decoder_layers(model) -> None:
    """torch.compile each decoder layer: fuses the norms, activations and casts between the
    matmuls. Layer by layer, identical layers share one compiled graph, and the packed length
    varies per micro-batch, so shapes are marked dynamic."""
    for layer in base_model(model).get_decoder().layers:
        layer.compile(dynamic=True)


def drop_compiled(model) -> None:
    """Forget the compiled wrappers, e.g. of a deep copy: a copied wrapper still calls the
    original module's layers."""
    for module in model.modules():
        module._compiled_call_impl = None


@contextmanager
def eager_layers(model):
    """Run `model` without its compiled layers: generation (KV cache, one-token steps) is not
    what they were compiled and measured for."""
    compiled = [(m, m._compiled_call_impl) for m in model.modules() if getattr(m, "_compiled_call_impl", None)]
    for m, _ in compiled:
        m._compiled_call_impl = None
    try:
        yield model
    finally:
        for m, fn in compiled:
            m._compiled_call_impl = fn
