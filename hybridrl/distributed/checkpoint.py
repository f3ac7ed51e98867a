"""Sharded model and optimizer state through torch.distributed.checkpoint (DCP).

Every rank writes its own shards of `get_model_state_dict` / `get_optimizer_state_dict`
(keys are the HF parameter names, so resharding is by name): a checkpoint saved by N ranks
loads on M ranks, and on one process without any process group. A role's directory:

  <role>/config.json, tokenizer files   the HF config (and tokenizer) to rebuild the model
  <role>/model/                         DCP: the weights
  <role>/optim/                         DCP: the optimizer state (Adam moments, step)
  <role>/scheduler.pt                   LR scheduler state (identical on every rank)

`export_hf` turns `<role>` into a plain HF model directory.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridrl.distributed.fsdp import dp_rank, dp_size


def _single() -> bool:
    """No process group (one device, or `hybridrl export`): DCP reads and writes all shards itself."""
    return dp_size() == 1 and not torch.distributed.is_initialized()


def _save(state: dict, path: Path) -> None:
    with warnings.catch_warnings():  # DCP warns that one process without a group saves alone: intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(path), no_dist=_single())


def _load(state: dict, path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path), no_dist=_single())


def is_sharded_checkpoint(path: str | Path) -> bool:
    return (Path(path) / "model" / ".metadata").exists()


def save_model(model: nn.Module, path: str | Path, hf_config=None, tokenizer=None) -> None:
    """Collective: every rank calls it. `hf_config` / `tokenizer` are written by rank 0."""
    path = Path(path)
    if dp_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        if hf_config is not None:
            hf_config.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    _save(get_model_state_dict(model), path / "model")


def load_model(model: nn.Module, path: str | Path) -> None:
    """Collective. Loads the weights by name into `model`, sharded or not, at any world size."""
    state = get_model_state_dict(model)
    _load(state, Path(path) / "model")
    set_model_state_dict(model, state)


def save_optimizer(model: nn.Module, optimizer, scheduler, path: str | Path) -> None:
    path = Path(path)
    _save(get_optimizer_state_dict(model, optimizer), path / "optim")
    if dp_rank() == 0:
        torch.save(scheduler.state_dict(), path / "scheduler.pt")


def load_optimizer(model: nn.Module, optimizer, scheduler, path: str | Path) -> None:
    """Collective. A fresh optimizer gets its state created first (a zero-lr step on zero
    gradients inside `get_optimizer_state_dict`), so DCP has tensors to load into."""
    path = Path(path)
    state = get_optimizer_state_dict(model, optimizer)
    _load(state, path / "optim")
    set_optimizer_state_dict(model, optimizer, state)
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))


def save_hf(model: nn.Module, path: str | Path, tokenizer=None) -> None:
    """Collective: `model` (sharded or not) as a plain HF directory written by rank 0; the
    shards are gathered into full tensors in CPU memory of rank 0 first."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dp_rank() == 0:
        model.save_pretrained(path, state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)


def export_hf(role_dir: str | Path, out: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write `role_dir` (config + DCP weights) as a plain HF directory: config.json,
    model.safetensors (in `dtype`; training keeps fp32 masters), tokenizer. Runs in one
    process; needs no GPU and no process group."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    role_dir, out = Path(role_dir), Path(out)
    if not is_sharded_checkpoint(role_dir):
        raise FileNotFoundError(f"{role_dir} is not a sharded hybridrl checkpoint directory (no model/.metadata)")
    config = AutoConfig.from_pretrained(role_dir)
    with torch.device("meta"):  # no random init: every weight comes from the checkpoint
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to_empty(device="cpu")
    model.tie_weights()
    load_model(model, role_dir)
    model.to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if (role_dir / "tokenizer_config.json").exists():
        AutoTokenizer.from_pretrained(role_dir).save_pretrained(out)
    return out
