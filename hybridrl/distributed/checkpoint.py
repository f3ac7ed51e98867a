"""Sharded model and optimizer state through torch.distributed.checkpoint (DCP).

Every rank writes its own shards of `get_model_state_dict` / `get_optimizer_state_dict`
(keys are the HF parameter names, so resharding is by name): a checkpoint saved by N ranks
loads on M ranks, and on one process without any process group. A role's directory:

  <role>/config.json, tokenizer files   the HF config (and tokenizer) to rebuild the model
  <role>/model/                         DCP: the weights
  <role>/optim/                         DCP: the optimizer state (Adam moments, step)
  <role>/scheduler.pt                   LR scheduler state (identical on every rank)

`export_hf` turns `<role>` into a plain HF model directory.

Loading never unpickles arbitrary objects, so a checkpoint from someone else cannot run code:
DCP's `.metadata` is a pickle, read here by an unpickler that admits only DCP's own metadata
classes (and torch dtypes/sizes), and the non-tensor entries (the optimizer's param_groups)
are read with `torch.load(weights_only=True)` in place of DCP's default `weights_only=False`.
Anything else is refused with a `CheckpointError` ("... is not a valid checkpoint: ...").
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridrl.distributed.fsdp import dp_rank, dp_size


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded safely or at all (crafted, corrupt, truncated)."""


# Every global a `.metadata` written by torch.distributed.checkpoint refers to (torch 2.11 to
# 2.13; found by recording `find_class` over model and optimizer checkpoints). Each is a plain
# data class or a pure lookup, so calling it with attacker-chosen arguments does nothing else.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise CheckpointError(f"its .metadata refers to {module}.{name}, which is not checkpoint metadata")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with `.metadata` read by `_MetadataUnpickler` and checked: a Metadata
    whose shard files are plain names inside the checkpoint directory."""

    def __init__(self, path: str | Path):
        super().__init__(path)
        self._checked: Metadata | None = None

    def check(self) -> None:
        """Read and check `.metadata` now, before DCP (which would log and wrap the error)."""
        self._checked = self.read_metadata()

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")
        if self._checked is not None and rank is None:
            return self._checked
        path = Path(self.path) / (".metadata" if rank is None else f"__{rank}.metadata")
        try:
            with open(path, "rb") as f:
                metadata = _MetadataUnpickler(f).load()
        except CheckpointError:
            raise
        except Exception as e:  # truncated, not a pickle, a class renamed away
            raise CheckpointError(f"{path} cannot be read ({type(e).__name__}: {e})") from None
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise CheckpointError(f"{path} holds a {type(metadata).__name__}, not checkpoint metadata")
        for info in metadata.storage_data.values():
            name = getattr(info, "relative_path", None)
            if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
                raise CheckpointError(f"{path} points at a shard file {name!r} outside its directory")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, but non-tensor entries (optimizer param_groups: numbers, bools,
    tuples, name lists) are read with `weights_only=True`."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            obj = torch.load(value, weights_only=True)
        except Exception as e:
            raise CheckpointError(f"entry {read_item.dest_index.fqn!r} is not plain data ({str(e).splitlines()[0]})") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_plain(file: str | Path):
    """A small `torch.save`d file of tensors and plain values (scheduler, RNG states), read with
    `weights_only=True`; a CheckpointError when it is missing or holds anything else."""
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except Exception as e:
        raise CheckpointError(f"{file} is not a valid checkpoint file: {_reason(e)}") from None


def _single() -> bool:
    """No process group (one device, or `hybridrl export`): DCP reads and writes all shards itself."""
    return dp_size() == 1 and not torch.distributed.is_initialized()


def _save(state: dict, path: Path) -> None:
    with warnings.catch_warnings():  # DCP warns that one process without a group saves alone: intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(path), no_dist=_single())


def _load(state: dict, path: Path) -> None:
    """Every failure to read `path` (refused, corrupt, missing entries) becomes one CheckpointError;
    DCP wraps errors raised on any rank in a CheckpointException, unwrapped here."""
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"{path} is not a valid checkpoint: no .metadata")
    reader = SafeFileSystemReader(path)
    try:
        reader.check()
    except CheckpointError as e:
        raise CheckpointError(f"{path} is not a valid checkpoint: {e}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=_single())
    except Exception as e:
        raise CheckpointError(f"{path} is not a valid checkpoint: {_reason(e)}") from None


def _reason(e: BaseException) -> str:
    failures = getattr(e, "failures", None)  # torch's CheckpointException: {rank: (exception, traceback)}
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        e = first[0] if isinstance(first, tuple) else first
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


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
    scheduler.load_state_dict(load_plain(path / "scheduler.pt"))


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
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    role_dir, out = Path(role_dir), Path(out)
    if not is_sharded_checkpoint(role_dir):
        raise FileNotFoundError(f"{role_dir} is not a sharded hybridrl checkpoint directory (no model/.metadata)")
    config = AutoConfig.from_pretrained(role_dir)
    # A reward model (algorithm.name=rm) is saved as a sequence classifier and exported as one.
    classifier = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
    auto = AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
    with torch.device("meta"):  # no random init: every weight comes from the checkpoint
        model = auto.from_config(config, dtype=torch.float32)
    model.to_empty(device="cpu")
    model.tie_weights()
    load_model(model, role_dir)
    model.to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if (role_dir / "tokenizer_config.json").exists():
        AutoTokenizer.from_pretrained(role_dir).save_pretrained(out)
    return out
