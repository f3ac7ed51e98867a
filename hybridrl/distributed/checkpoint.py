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

import errno
import io
import math
import os
import pickle
import re
import stat
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridrl.distributed.fsdp import dp_rank, dp_size

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # a decoder layer's parameters, in any model family


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
            with open_regular(path) as f:
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
        _check_storage(metadata, path.parent)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _check_storage(metadata: Metadata, directory: Path) -> None:
    """Every shard is a regular file in `directory` (not a link out of it), every entry lies inside its
    shard, and the tensors the metadata declares fit in the bytes stored: a crafted `.metadata` cannot
    make DCP seek before a file or allocate more than the checkpoint holds."""
    sizes: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = info.relative_path
        if name not in sizes:
            file = directory / name
            if file.is_symlink() or not file.is_file():
                what = "a symbolic link" if file.is_symlink() else "missing or not a regular file"
                raise CheckpointError(f"its shard {name} is {what}")
            sizes[name] = file.stat().st_size
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(offset, int) and isinstance(length, int) and 0 <= offset and 0 <= length):
            raise CheckpointError(f"its .metadata gives {name} an invalid offset {offset!r} or size {length!r}")
        if offset + length > sizes[name]:
            raise CheckpointError(
                f"its .metadata places an entry at bytes {offset}..{offset + length} of {name} ({sizes[name]} bytes)"
            )
    declared = 0
    for value in metadata.state_dict_metadata.values():
        size = getattr(value, "size", None)
        if size is not None:
            props = getattr(value, "properties", None)
            itemsize = torch.empty((), dtype=props.dtype).element_size() if props is not None else 1
            declared += math.prod(size) * itemsize
    if declared > sum(sizes.values()):
        raise CheckpointError(
            f"its .metadata declares {declared} bytes of tensors, more than its shards hold ({sum(sizes.values())})"
        )


def check_model_config(model: nn.Module, role_dir: Path) -> None:
    """Refuse a role directory whose config.json builds a model (`model`, on the meta device) with
    parameters shaped unlike the saved weights (say vocab_size 2**33), before anything is allocated."""
    reader = SafeFileSystemReader(Path(role_dir) / "model")
    try:
        saved = reader.read_metadata().state_dict_metadata
    except CheckpointError as e:
        raise CheckpointError(f"{role_dir / 'model'} is not a valid checkpoint: {e}") from None
    for name, tensor in model.state_dict().items():
        size = getattr(saved.get(name), "size", None)
        if size is not None and tuple(size) != tuple(tensor.shape):
            raise CheckpointError(
                f"{role_dir} is not a valid checkpoint: its config.json makes {name} {tuple(tensor.shape)}, "
                f"but the saved weights are {tuple(size)}"
            )
    layers = {int(m.group(1)) for name in model.state_dict() if (m := _LAYER.search(name))}
    saved_layers = {int(m.group(1)) for name in saved if (m := _LAYER.search(name))}
    if saved_layers and max(saved_layers) >= len(layers):
        raise CheckpointError(
            f"{role_dir} is not a valid checkpoint: its config.json builds {len(layers)} layers, "
            f"but the saved weights hold {max(saved_layers) + 1}"
        )
    built = sum(p.numel() for p in model.parameters())
    stored = sum(math.prod(v.size) for v in saved.values() if getattr(v, "size", None) is not None)
    if built > stored + 1024:  # names may differ (a critic's value head), the sizes may not
        raise CheckpointError(
            f"{role_dir} is not a valid checkpoint: its config.json builds {built} parameters, the saved weights hold {stored}"
        )


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
        with open_regular(file) as f:
            return torch.load(f, weights_only=True, map_location="cpu")
    except Exception as e:
        raise CheckpointError(f"{file} is not a valid checkpoint file: {_reason(e)}") from None


def open_regular(path: str | Path):
    """`path` opened for reading in binary, when it is a regular file (after links): opened without
    blocking and checked on the descriptor, so a FIFO (which waits for a writer for ever) or a
    device (/dev/zero never ends) is an OSError instead of a hang."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{_kind(mode)}, not a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device"


def check_files(directory: str | Path, max_entries: int = 100_000) -> None:
    """Every entry under a checkpoint directory is a regular file or a directory inside it: a FIFO
    or device under a name a loader opens would block it or never end, and a link out (a
    chat_template.jinja -> /etc/shadow) would copy another file into an exported model."""
    directory = Path(directory)
    inside = directory.resolve()
    for n, p in enumerate(directory.rglob("*")):
        if n >= max_entries:
            raise CheckpointError(f"{directory} is not a valid checkpoint: more than {max_entries} files")
        where = p.relative_to(directory)
        if p.is_symlink() and not p.resolve().is_relative_to(inside):
            raise CheckpointError(f"{directory} is not a valid checkpoint: {where} is a link to {os.readlink(p)}, outside it")
        try:
            mode = p.stat().st_mode
        except OSError as e:  # a dangling link
            raise CheckpointError(f"{directory} is not a valid checkpoint: {where}: {e.strerror}") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CheckpointError(f"{directory} is not a valid checkpoint: {where} is {_kind(mode)}, not a file")


def load_scheduler_state(file: str | Path) -> dict:
    """A saved LR scheduler's state (`scheduler.pt`), checked to be what `LambdaLR.load_state_dict`
    takes (counts and learning rates), so that a malformed file is a CheckpointError at load and
    not a TypeError at the next optimizer step."""
    state = load_plain(file)

    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    problem = None
    if not isinstance(state, dict):
        problem = f"holds a {type(state).__name__}, not a scheduler's state"
    elif "last_epoch" not in state or "base_lrs" not in state:
        problem = "no last_epoch or base_lrs: not a scheduler's state"
    else:
        for key in ("last_epoch", "_step_count"):
            if key in state and not (isinstance(state[key], int) and not isinstance(state[key], bool)):
                problem = f"{key} is {str(state[key])[:40]!r}, not a count"
        for key in ("base_lrs", "_last_lr"):
            if key in state and not (isinstance(state[key], list) and all(number(v) for v in state[key])):
                problem = f"{key} is {str(state[key])[:40]!r}, not a list of learning rates"
    if problem:
        raise CheckpointError(f"{file} is not a valid checkpoint file: {problem}")
    return state


def _single() -> bool:
    """No process group (one device, or `hybridrl export`): DCP reads and writes all shards itself."""
    return dp_size() == 1 and not torch.distributed.is_initialized()


def _save(state: dict, path: Path) -> None:
    with warnings.catch_warnings():  # DCP warns that one process without a group saves alone: intended
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.save(state, checkpoint_id=str(path), no_dist=_single())
        except CheckpointException as e:
            _reraise_interrupt(e)
            raise


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
    except (Exception, CheckpointException) as e:  # CheckpointException derives from BaseException
        _reraise_interrupt(e)
        raise CheckpointError(f"{path} is not a valid checkpoint: {_reason(e)}") from None


def _reraise_interrupt(e: BaseException) -> None:
    """DCP wraps whatever a rank raised, a Ctrl-C or a SIGTERM (SignalStop) included, in a
    CheckpointException: the stop is raised again as itself, so that the run ends as a stop (its
    message and exit status), not as a broken checkpoint. The half-written directory is left to
    ckpt.begin_save's protocol: it never becomes `latest`."""
    stop = next((inner for inner in _raised(e) if isinstance(inner, KeyboardInterrupt)), None)
    if stop is not None:
        raise stop from None


def _raised(e: BaseException) -> list[BaseException]:
    """What the ranks raised, for torch's CheckpointException ({rank: (exception, traceback)});
    [e] itself for any other error."""
    failures = getattr(e, "failures", None)
    if not (isinstance(failures, dict) and failures):
        return [e]
    return [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def _reason(e: BaseException) -> str:
    e = _raised(e)[0]
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # "Class validation error for validator ...:" then the reason
        return f"{lines[0]} {lines[1]}"
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
    scheduler.load_state_dict(load_scheduler_state(path / "scheduler.pt"))


def save_hf(model: nn.Module, path: str | Path, tokenizer=None) -> None:
    """Collective: `model` (sharded or not) as a plain HF directory written by rank 0; the
    shards are gathered into full tensors in CPU memory of rank 0 first."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dp_rank() == 0:
        model.save_pretrained(path, state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)


def check_role_config(role_dir: str | Path, backbone_only: bool = False) -> None:
    """`check_model_config` for the model `role_dir/config.json` describes, built on the meta device
    (`backbone_only`: a critic's, which has no LM head)."""
    check_model_config(_meta_model(Path(role_dir), backbone_only), Path(role_dir))


def _meta_model(role_dir: Path, backbone_only: bool = False) -> nn.Module:
    """The model `role_dir/config.json` describes, on the meta device (nothing allocated); a reward
    model (algorithm.name=rm) is a sequence classifier. CheckpointError when the config does not
    build one (an unknown model_type, config.json a directory, no layers, ...)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    try:
        if not (role_dir / "config.json").is_file():
            raise ValueError("config.json is missing or not a file")
        config = AutoConfig.from_pretrained(role_dir)
        layers = getattr(config, "num_hidden_layers", 1)
        if not (isinstance(layers, int) and layers >= 1):
            raise ValueError(f"num_hidden_layers is {layers!r}")
        classifier = any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
        auto = AutoModel if backbone_only else AutoModelForSequenceClassification if classifier else AutoModelForCausalLM
        with torch.device("meta"):
            return auto.from_config(config, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 (transformers and huggingface_hub raise many kinds for a bad config)
        why = _reason(e)
        raise CheckpointError(f"{role_dir} is not a valid checkpoint: its config.json does not build a model ({why})") from None


def export_hf(role_dir: str | Path, out: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write `role_dir` (config + DCP weights) as a plain HF directory: config.json,
    model.safetensors (in `dtype`; training keeps fp32 masters), tokenizer. Runs in one
    process; needs no GPU and no process group."""
    from transformers import AutoTokenizer

    role_dir, out = Path(role_dir), Path(out)
    if not is_sharded_checkpoint(role_dir):
        raise FileNotFoundError(f"{role_dir} is not a sharded hybridrl checkpoint directory (no model/.metadata)")
    check_files(role_dir)
    model = _meta_model(role_dir)  # on the meta device: every weight comes from the checkpoint
    check_model_config(model, role_dir)
    model.to_empty(device="cpu")
    model.tie_weights()
    load_model(model, role_dir)
    model.to(dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    if (role_dir / "tokenizer_config.json").exists():
        try:
            tokenizer = AutoTokenizer.from_pretrained(role_dir)
        except Exception as e:  # noqa: BLE001 (tokenizer.json not JSON, a vocabulary that does not parse, ...)
            raise CheckpointError(f"{role_dir} is not a valid checkpoint: its tokenizer does not load ({_reason(e)})") from None
        tokenizer.save_pretrained(out)
    return out
