"""The Python API's arguments as what a config names: paths as given, objects saved under the run's `inputs/`.

- a model object (actor, critic) is saved with `save_pretrained` and loaded by path. The workers build
  their own (sharded) copy from a path on every backend anyway, the frozen reference and checkpoints
  reload from it, and training never changes the caller's object; a large model costs one save
  (seconds per GB) and its size on disk.
- rows (a list of dicts, a pandas DataFrame, a `datasets.Dataset`, a pyarrow Table) are written as
  JSONL and read back with the row checks every data file gets (hybridrl/data).

`config_values` says which keys the arguments set (before the config is checked), `write` saves the
objects where the resolved config says they are. A problem with an argument is a `DataError` (rows) or
a `ModelLoadError` (models) with the one line to show, as the same problem in a file would be.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hybridrl.data.errors import DataError

# verl's row fields: what a reward function of the (data_source, solution_str, ground_truth, extra_info)
# form can be given (hybridrl/data/dataset.py).
ROW_FIELDS = {"prompt", "data_source", "reward_model", "extra_info", "ability", "agent_name", "tools_kwargs"}


def is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def is_data_path(x: Any) -> bool:
    """A file path or a list of them (not rows)."""
    return is_path(x) or (isinstance(x, (list, tuple)) and bool(x) and all(is_path(p) for p in x))


def data_paths(x: Any) -> str | list[str]:
    return os.fspath(x) if is_path(x) else [os.fspath(p) for p in x]


def config_values(
    inputs: Path, actor: Any, critic: Any, tokenizer: Any, train_data: Any, val_data: Any, reward_models: bool
) -> dict[str, Any]:
    """Config keys the arguments set: a path as given, an object as the path under `inputs` it will be saved to."""
    out: dict[str, Any] = {}
    if actor is not None:
        out["actor_rollout_ref.model.path"] = os.fspath(actor) if is_path(actor) else str(inputs / "actor")
        if not is_path(actor):
            out["actor_rollout_ref.model.random_init"] = False  # its weights are saved with it
    if tokenizer is not None and (is_path(tokenizer) or is_path(actor) or actor is None):  # else saved beside the actor
        out["actor_rollout_ref.model.tokenizer_path"] = os.fspath(tokenizer) if is_path(tokenizer) else str(inputs / "tokenizer")
    if critic is not None:
        out["critic.model.path"] = os.fspath(critic) if is_path(critic) else str(inputs / "critic")
    if reward_models:  # decided here, before validation, so the checks see the reward model
        out["reward_model.enable"] = True
    for name, key, data in (("train_data", "data.train_files", train_data), ("val_data", "data.val_files", val_data)):
        if data is not None:
            out[key] = data_paths(data) if is_data_path(data) else str(inputs / f"{name}.jsonl")
    return out


def write(cfg, actor: Any, critic: Any, tokenizer: Any, train_data: Any, val_data: Any) -> None:
    """Save the object arguments where the config says they are (the run directory's inputs/)."""
    m = cfg.actor_rollout_ref.model
    if actor is not None and not is_path(actor):
        save_model(actor, m.path, "actor")
        if tokenizer is None:  # the model's own: the directory it was loaded from
            tokenizer = tokenizer_of(actor)
        if not is_path(tokenizer):
            tokenizer.save_pretrained(m.path)
    elif tokenizer is not None and not is_path(tokenizer):
        Path(m.tokenizer_path).mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(m.tokenizer_path)
    if critic is not None and not is_path(critic):
        save_model(critic, cfg.critic.model.path, "critic")  # the critic reads the actor's tokenizer
    for name, data, files in (("train_data", train_data, cfg.data.train_files), ("val_data", val_data, cfg.data.val_files)):
        if data is not None and not is_data_path(data):
            write_rows(data, files if isinstance(files, str) else files[0], name)


def save_model(model: Any, path: str, what: str) -> None:
    if not hasattr(model, "save_pretrained"):
        from hybridrl.models.loading import ModelLoadError

        raise ModelLoadError(
            f"{what}: expected a model directory or a transformers PreTrainedModel (with save_pretrained), got "
            f"{type(model).__name__}"
        )
    Path(path).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)


def tokenizer_of(model: Any):
    """The tokenizer in the local directory a model object was loaded from (its name_or_path)."""
    from hybridrl.models.loading import ModelLoadError, load_tokenizer

    source = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not source or not Path(source).is_dir():
        raise ModelLoadError(
            f"actor: a model object needs its tokenizer: pass tokenizer= (a directory or a tokenizer object); "
            f"the model's name_or_path {source!r} is not a local directory to take it from"
        )
    return load_tokenizer(source, what="the actor model's name_or_path")


def rows(data: Any, name: str) -> list:
    """Rows of files, a list of dicts, a pandas DataFrame, a datasets.Dataset or a pyarrow Table."""
    if is_data_path(data):
        from hybridrl.data.converters import read_rows

        return [r for p in ([data] if is_path(data) else data) for r in read_rows(os.fspath(p))]
    if isinstance(data, Mapping):
        raise DataError(f"{name}: got one dict; pass a list of row dicts (or a DataFrame, Dataset, file path)")
    if hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas
        return data.to_dict(orient="records")
    if hasattr(data, "to_pylist"):  # pyarrow.Table
        return data.to_pylist()
    if hasattr(data, "to_list") and hasattr(data, "features"):  # datasets.Dataset
        return data.to_list()
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        return list(data)
    raise DataError(
        f"{name}: expected a .jsonl/.parquet path, a list of row dicts, a pandas DataFrame or a datasets.Dataset, "
        f"got {type(data).__name__}"
    )


def write_rows(data: Any, path: str, name: str) -> None:
    found = rows(data, name)
    if not found:
        raise DataError(f"{name}: no rows; give at least one")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, row in enumerate(found):
            try:
                f.write(json.dumps(row, default=_jsonable, ensure_ascii=False) + "\n")
            except TypeError as e:
                raise DataError(f"{name}, row {i}: {e}; rows hold strings, numbers, lists and dicts") from None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars (pandas/parquet rows hold them)
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} is not JSON-serializable")


def with_source(data: Any, name: str, fn: Any) -> Any:
    """Rows (objects, not files) for a reward function of the (data_source, solution_str, ground_truth,
    extra_info) form: a default data_source where a row has none, and a one-line error for columns the
    function would never see."""
    if data is None or is_data_path(data):
        return data
    out = []
    for i, row in enumerate(rows(data, name)):
        if not isinstance(row, Mapping):
            return data  # the data layer's own check names the row
        unseen = sorted(set(row) - ROW_FIELDS)
        if unseen and "reward_model" not in row and "extra_info" not in row:
            fname = getattr(fn, "__name__", "reward_fn")
            raise DataError(
                f"{name}, row {i}: column(s) {unseen} would never reach {fname}(data_source, solution_str, "
                f"ground_truth, extra_info); write it TRL's way, f(prompts, completions, {', '.join(unseen)}, **kw), "
                f"or put the answer under reward_model.ground_truth"
            )
        out.append(row if row.get("data_source") else {**row, "data_source": "reward_fn"})
    return out
