"""torch.compile of the decoder layers, and turning the compiled layers off again (a deep copy,
generation). `hybridrl.distributed.parallelize` applies them with the other training hooks."""

from __future__ import annotations

from contextlib import contextmanager

from hybridrl.models.packing import base_model


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
