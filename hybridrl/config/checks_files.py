"""Checks on the names and files a config points at, so that `explain` and `train` give one verdict.

`file_problems` runs in `validate` (no file is read): run names that stay inside the runs folder,
the sandbox-fusion keys. `path_problems` runs with the path checks
(`config/paths.py`, skipped by `explain --no-path-check`): the reward model's directory (or that it
has none, unless the Python API was given the reward model as an object), the tool and
interaction configs loaded as the agent loop loads them (their classes imported: a tool config is
code). `data_size_problems` (explain only): a training set large enough for one batch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from .extensions import feature_rule


def file_problems(cfg: Any, problem: type) -> list:
    """Every problem found here, as `problem(message, keys)` (validate.Problem)."""
    return _run_name_problems(cfg, problem) + _sandbox_problems(cfg, problem)


def _sandbox_problems(cfg: Any, problem: type) -> list:
    """reward_model.sandbox_fusion (hybridrl/rewards/code_sandbox.py)."""
    sf, key, out = cfg.reward_model.sandbox_fusion, "reward_model.sandbox_fusion", []
    if sf.url is None:
        return out
    if not (isinstance(sf.url, str) and sf.url.startswith(("http://", "https://"))):
        out.append(
            problem(
                f"{key}.url={sf.url!r} must be an http:// or https:// URL (the service's /run_code endpoint)", (f"{key}.url",)
            )
        )
    for name in ("max_concurrent", "memory_limit_mb"):
        value = getattr(sf, name)
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            out.append(problem(f"{key}.{name}={value!r} must be a whole number >= 1", (f"{key}.{name}",)))
    if cfg.custom_reward_function.path or cfg.custom_reward_function.remote.url:
        out.append(
            problem(
                f"{key}.url scores code with the built-in scorers' routing; it cannot be combined with "
                "custom_reward_function.path or custom_reward_function.remote.url (score code inside your own function instead)",
                (f"{key}.url",),
            )
        )
    return out


def path_problems(cfg: Any, model_dir: Callable[[str, str | None], list[str]], in_memory_rm: bool = False) -> list[str]:
    """Problems with files on this machine, one message each (`model_dir`: paths.py's check of a
    model directory). `in_memory_rm`: the Python API was given reward_models=[...] objects, so
    reward_model.enable needs no path."""
    out = []
    rm = cfg.reward_model
    if cfg.algorithm.name == "rl" and rm.enable and rm.model.path:
        out += model_dir("reward_model.model.path", rm.model.path)
    elif cfg.algorithm.name == "rl" and rm.enable and not in_memory_rm:
        out.append(
            "reward_model.enable=true needs reward_model.model.path (a sequence-classifier directory, or a causal LM "
            "with reward_model.generative.enable=true)"
        )
    return out + _agent_config_problems(cfg)


def _agent_config_problems(cfg: Any) -> list[str]:
    """The tool and interaction configs, loaded (and their tools built) as the rollout will."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return []
    out = []
    for key, path in (("tool_config_path", mt.tool_config_path), ("interaction_config_path", mt.interaction_config_path)):
        if not path or not os.path.isfile(path):
            continue  # missing: reported by validate
        # The agent loop's own loaders (handed in: config/extensions.py): the files are read as the rollout reads them.
        load = feature_rule("tool_config" if key == "tool_config_path" else "interaction_config")
        try:
            load(path)
        except ValueError as e:
            out.append(f"actor_rollout_ref.rollout.multi_turn.{key}: {_first_line(e)}")
        except Exception as e:  # a tool's own constructor, a file that is not text
            out.append(
                f"actor_rollout_ref.rollout.multi_turn.{key}={path!r}: loading it raised {type(e).__name__}: {_first_line(e)}"
            )
    return out


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def data_size_problems(cfg: Any) -> list[str]:
    """A batch larger than the training set stops `train` when it reads the data; `explain`, which
    reads no rows, asks this. (`train` itself reports the rows' own problems first.)"""
    files = cfg.data.train_files
    files = [files] if isinstance(files, str) else list(files or [])
    batch = (
        (cfg.data.gen_batch_size or cfg.data.train_batch_size)
        if cfg.algorithm.filter_groups.enable
        else cfg.data.train_batch_size
    )
    if cfg.algorithm.name != "rl" or not files or not isinstance(batch, int) or not all(os.path.isfile(f) for f in files):
        return []
    rows = 0
    for f in files:
        n = _count_rows(Path(f))
        if n is None:
            return []
        rows += n
    if rows and batch > rows:
        return [
            f"data.train_batch_size={batch} is larger than the training set ({rows} rows in {', '.join(files)}); "
            f"use at most {rows}"
        ]
    return []


def _count_rows(path: Path) -> int | None:
    """Rows of a parquet (its footer) or JSONL file (non-blank lines); None when unknown or too big to count quickly."""
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        if path.suffix.lower() == ".jsonl" and path.stat().st_size <= 1 << 30:
            with open(path, "rb") as f:
                return sum(1 for line in f if line.strip())
    except Exception:  # an unreadable file is reported when it is read
        return None
    return None


def _run_name_problems(cfg: Any, problem: type) -> list:
    out = []
    for name in ("project_name", "experiment_name"):
        value, key = getattr(cfg.trainer, name), f"trainer.{name}"
        # One path component, so that runs/<project_name>/<experiment_name> stays inside runs/.
        if not isinstance(value, str) or value in ("", ".", "..") or any(c in value for c in "/\\\0"):
            out.append(
                problem(
                    f"{key}={value!r} must be one plain name (no '/', not '.' or '..'): the run is written to "
                    "runs/<project_name>/<experiment_name>; to write elsewhere set trainer.default_local_dir",
                    (key,),
                )
            )
        elif any(ord(c) < 32 or ord(c) == 127 for c in value):  # a newline would split every log line naming it
            out.append(problem(f"{key}={value[:60]!r} holds a control character (a newline, a tab); use a plain name", (key,)))
        elif len(value.encode("utf-8", "surrogatepass")) > 255:
            out.append(
                problem(
                    f"{key} is {len(value.encode('utf-8', 'surrogatepass'))} bytes long ({value[:40]!r}...); a directory "
                    "name holds at most 255: use a shorter name",
                    (key,),
                )
            )
    return out
