"""Do the files and directories a config names exist on this machine?

`hybridrl explain` and `hybridrl train` run these checks before anything is loaded, so a typo in
a path costs a second, not a model load (or a minute of Hugging Face Hub retries). A config
planned on one machine for another can skip them (`hybridrl explain --no-path-check`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .checks_files import path_problems
from .schema import Config

DATA_SUFFIXES = (".jsonl", ".parquet")


def _as_list(value) -> list[str]:
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else list(value)


def _model_dir(key: str, path: str | None) -> list[str]:
    if not path:
        return []  # an empty path is a validation problem, reported there
    p = Path(path)
    if not p.exists():
        from hybridrl.config.hub import ALLOW_HUB_ENV, download_command, hub_allowed, looks_like_repo_id

        if hub_allowed() and looks_like_repo_id(path):
            return []  # downloaded before any model loads (hybridrl/models/hub.py)
        return [
            f"{key}={path!r} does not exist on this machine; hybridrl loads local model directories only "
            f"(download one first, e.g. `{download_command()}`, and set {key}=DIR; or allow Hub ids: "
            f"--allow-hub or {ALLOW_HUB_ENV}=1)"
        ]
    if not p.is_dir():
        return [f"{key}={path!r} is a file, not a model directory; give the directory that holds config.json"]
    if key.endswith(".path") and not (p / "config.json").exists():
        state = "it is empty" if not any(p.iterdir()) else "not a Hugging Face model directory"
        return [f"{key}={path!r} has no config.json ({state}); give a directory written by save_pretrained"]
    return []


def _files(key: str, value) -> list[str]:
    out = []
    for f in _as_list(value):
        suffix = Path(f).suffix.lower()
        if suffix not in DATA_SUFFIXES:
            out.append(f"{key}: {f!r} has unsupported type {suffix or '(none)'!r}; use .jsonl or .parquet")
        elif not Path(f).is_file():
            exists = Path(f).exists()
            state = (
                "is a directory"
                if Path(f).is_dir()
                else "is not a regular file (a FIFO or a device)"
                if exists
                else "does not exist"
            )
            out.append(f"{key}: {f!r} {state}; check the path (relative paths start from {os.getcwd()})")
        elif Path(f).stat().st_size == 0:
            out.append(f"{key}: {f!r} is empty (0 bytes); give a file with at least one row")
    return out


def _python_file(key: str, path: str | None) -> list[str]:
    """The file exists and parses (compiled, not run: explain executes no user code)."""
    if not path:
        return []
    if not Path(path).is_file():
        return [f"{key}={path!r} does not exist or is not a file; give the Python file that defines the scorer"]
    try:
        compile(Path(path).read_bytes(), path, "exec")
    except SyntaxError as e:
        return [f"{key}={path!r}: line {e.lineno}: {type(e).__name__}: {e.msg}; fix the file"]
    except ValueError as e:  # null bytes
        return [f"{key}={path!r} is not Python source ({e}); give a .py file"]
    return []


def _writable(key: str, path: Path) -> list[str]:
    """The run directory, or its nearest existing parent, must be a directory we can write in.

    Probed by creating (and at once removing) a nameless temporary file: permission bits alone
    say nothing for root, nor on a read-only mount.
    """
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        return [
            f"{key}: {str(p)!r} is a file, so the run directory {str(path)!r} cannot be created; set {key} to a directory path"
        ]
    try:
        with tempfile.TemporaryFile(dir=p):
            pass
    except OSError as e:
        return [
            f"{key}: cannot write in {str(p)!r} ({e.strerror or e}), so the run directory {str(path)!r} cannot be "
            f"written; set {key} to a writable directory"
        ]
    return []


def missing_paths(cfg: Config, in_memory_rm: bool = False) -> list[str]:
    """One message per path the run would need that is missing, of the wrong kind, or read-only
    (`in_memory_rm`: the reward model is an object given to the Python API, not a path)."""
    m, t = cfg.actor_rollout_ref.model, cfg.trainer
    out = _model_dir("actor_rollout_ref.model.path", m.path)
    if m.tokenizer_path != m.path:  # resolve() fills it in from model.path
        out += _model_dir("actor_rollout_ref.model.tokenizer_path", m.tokenizer_path)
    if cfg.critic_enabled and cfg.critic.model.path != m.path:
        out += _model_dir("critic.model.path", cfg.critic.model.path)
    out += _files("data.train_files", cfg.data.train_files)
    out += _files("data.val_files", cfg.data.val_files)
    if cfg.warmup.steps > 0:
        out += _files("warmup.files", cfg.warmup.files)
    out += _python_file("custom_reward_function.path", cfg.custom_reward_function.path)
    if t.resume_mode == "resume_path" and t.resume_from_path and not Path(t.resume_from_path).is_dir():
        out.append(f"trainer.resume_from_path={t.resume_from_path!r} does not exist; give a checkpoints/step_N directory")
    run = Path(t.default_local_dir or f"runs/{t.project_name}/{t.experiment_name}")
    out += _writable("trainer.default_local_dir", run)
    return out + path_problems(cfg, _model_dir, in_memory_rm)  # reward model, tool configs, data size (checks_files.py)
