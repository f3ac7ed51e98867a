"""`parallelize`: a freshly loaded model made ready for training passes on its device, in one call.

The order follows torchtitan's: hooks and compiled layers first (a mixture of experts' sparse
blocks, activation checkpointing, the packed-attention hook, torch.compile of the decoder
layers), then FSDP2 around them (`place`): fully_shard adds its own hooks to the blocks, and
compiled blocks run them eagerly (dynamo skips FSDP hooks). Model files stay free of all of it.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridrl.distributed.fsdp import place
from hybridrl.models import moe_block
from hybridrl.models.packing import enable_packing
from hybridrl.models.prepare import compile_decoder_layers


def parallelize(
    model: nn.Module,
    device: torch.device,
    *,
    remove_padding: bool,
    attn_backend: str = "auto",
    checkpointing: bool = False,
    compile_layers: bool = False,
    param_offload: bool = False,
    forward_methods: tuple[str, ...] = (),
    hooks_on: nn.Module | None = None,
    expert_parallel: int = 1,
) -> tuple[nn.Module, str | None]:
    """The placed model (moved to `device` on one rank, FSDP2-sharded over several) and its
    packed-attention backend, or None when its passes stay padded.

    `compile_layers` applies on CUDA only (on CPU it costs more than it saves for the models run
    there); `param_offload` keeps the sharded parameters in CPU memory (fsdp_config.param_offload);
    `forward_methods`: methods other than `forward` that callers run the model through (the
    critic's `response_values`), gathered by FSDP like `forward`; `hooks_on`: the HF model inside
    `model` that gets checkpointing, packing and compilation (the critic's backbone; default `model`).
    `expert_parallel`: a mixture of experts' experts split over groups of that many ranks
    (distributed/expert_parallel.py). A mixture of experts' decoder layers are not compiled (their
    routing decides shapes); its attention and norms run eagerly.
    """
    hooked = model if hooks_on is None else hooks_on
    sparse = moe_block.adopt(hooked)  # a mixture of experts: its sparse blocks (routing replay, grouped GEMMs, the aux loss)
    if checkpointing:
        # Non-reentrant: recomputation sees the same kwargs (the packed row's boundaries), and
        # it works when the inputs do not require grad (LoRA's frozen embeddings).
        hooked.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    backend = enable_packing(hooked, attn_backend, device) if remove_padding else None
    if compile_layers and device.type == "cuda" and sparse is None:
        compile_decoder_layers(hooked)
    return place(model, device, param_offload, forward_methods, expert_parallel=expert_parallel), backend
