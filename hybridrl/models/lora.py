"""LoRA through peft: adapters on the policy, the base as the reference, merged weights out.

- `apply_lora` wraps the loaded HF model; only the adapters require grad, so the optimizer
  (which takes trainable parameters only) never sees the base weights.
- The reference policy is the same module with adapters disabled (`reference_view`): no second
  copy of the base in memory.
- Engines that take weights (the native rollout engine's `load_weights`, exports) get the
  merged policy from `merged_named_parameters`: HF base names -> W + (alpha / r) B A, so the
  rollouts follow the current policy and not the stale base (the silent failure of verl #7495).

Under grad the embeddings' output requires grad (`_layers_take_grad`), as it does in full
fine-tuning: the frozen embeddings would otherwise hand the first decoder layer an input without
grad and the others one with it, and each compiled decoder layer (models/prepare.py) would build a
second forward-and-backward graph for that one layer. Parameter gradients do not change.

Checkpoints (`save_lora_checkpoint`): `actor/` is a plain HF directory of the merged weights
(from_pretrained-loadable, for eval and export) and `actor/adapter/` holds the peft adapter.
Resume loads the base (model.path, or `lora_base/` for random-init bases) and the adapter, so it
is exact; merged weights alone could not be split back into base and adapter.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

ADAPTER_DIR = "adapter"  # inside the checkpoint's actor/ directory
BASE_DIR = "lora_base"  # a random-init base, saved beside actor/ so resume can rebuild it


def apply_lora(model, rank: int, alpha: int, target_modules):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=target_modules, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"
    )
    return _layers_take_grad(get_peft_model(model, config))


def load_lora(model, adapter_dir: str | Path):
    """The base `model` with a saved adapter, trainable (resume)."""
    from peft import PeftModel

    return _layers_take_grad(PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True))


def _embeddings_out_requires_grad(module, args, output):
    if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and not output.requires_grad:
        return output.requires_grad_(True)
    return None


def _layers_take_grad(model):
    """Every decoder layer gets an input that requires grad when grad is on (the module docstring says
    why): HF's `enable_input_require_grads` does it under no_grad too, which would trade the graph
    this saves for another one in the reference and log-prob passes."""
    model.get_input_embeddings().register_forward_hook(_embeddings_out_requires_grad)
    return model


def check_adapter_dir(path: str | Path) -> Path:
    """`path` if it holds a saved peft adapter; a one-line error naming the key otherwise."""
    if not (Path(path) / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"actor_rollout_ref.model.lora_adapter_path={path} holds no adapter_config.json: "
            "point it at a directory written by peft's save_pretrained"
        )
    return Path(path)


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


@contextmanager
def reference_view(model):
    """The reference policy: the base model, adapters off (no copy)."""
    with model.disable_adapter():
        yield model


def _lora_layers(base) -> dict[str, torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value: FSDP2 shards (DTensors) gathered (a collective: every rank of
    the mesh must call it, in the same order), plain tensors as they are."""
    from torch.distributed.tensor import DTensor

    t = t.detach()
    return t.full_tensor() if isinstance(t, DTensor) else t


def _is_writer() -> bool:
    """Rank 0 writes the files of a (possibly sharded) checkpoint; every rank gathers."""
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def adapter_delta(layer) -> torch.Tensor | None:
    """Sum over active, unmerged adapters of scale * B @ A, in the base weight's layout."""
    if layer.disable_adapters:
        return None
    delta = None
    for name in layer.active_adapters:
        if name not in layer.lora_A or name in layer.merged_adapters:
            continue
        a, b = _full(layer.lora_A[name].weight), _full(layer.lora_B[name].weight)  # (r, in), (out, r)
        d = (b.float() @ a.float()) * layer.scaling[name]  # (out, in)
        if getattr(layer, "fan_in_fan_out", False):
            d = d.T
        delta = d if delta is None else delta + d
    return delta


@torch.no_grad()
def merged_named_parameters(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF base name, merged weight) for every parameter of the policy, adapters folded in.

    Works on a plain (non-peft) model too, yielding its parameters unchanged. Under FSDP2 the
    tensors are whole, gathered one parameter at a time: a collective, every rank must consume
    the iterator in step.
    """
    base = model.get_base_model() if is_lora(model) else model
    layers = _lora_layers(base) if is_lora(model) else {}
    for name, p in base.named_parameters():
        if ".lora_" in name:
            continue
        if ".base_layer." not in name:
            yield name, _full(p)
            continue
        owner, rest = name.split(".base_layer.", 1)
        delta = adapter_delta(layers[owner]) if rest == "weight" else None
        p = _full(p)
        yield f"{owner}.{rest}", p if delta is None else (p.float() + delta).to(p.dtype)


def adapter_state_dict(model) -> dict[str, torch.Tensor]:
    """The peft model's adapter parameters, whole (gathered under FSDP2; collective)."""
    return {name: _full(p).contiguous() for name, p in model.named_parameters() if ".lora_" in name}


def save_lora_checkpoint(model, actor_dir: Path, base_dir: Path | None) -> None:
    """actor_dir: merged HF model (+ adapter/); base_dir: the unmodified base, when given.
    Collective under FSDP2 (every rank gathers, rank 0 writes)."""
    base, writer = model.get_base_model(), _is_writer()
    merged = {k: v.contiguous() for k, v in merged_named_parameters(model)}
    adapter = adapter_state_dict(model)
    if writer:
        base.save_pretrained(actor_dir, state_dict=merged, safe_serialization=True)
        model.save_pretrained(actor_dir / ADAPTER_DIR, state_dict=adapter, safe_serialization=True)
    del merged
    if base_dir is not None:
        with model.disable_adapter():
            state = {k: v.contiguous() for k, v in merged_named_parameters(model)}
        if writer:
            base.save_pretrained(base_dir, state_dict=state, safe_serialization=True)
