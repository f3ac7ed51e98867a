"""One launch path for both front doors, the CLI (`hybridrl train`) and the Python API (`RLTrainer.fit`).

What a run needs checked before any model work, and how a failure reads, said once:

- `trainer_class(cfg)`: the trainer of algorithm.name;
- `input_problems(cfg)`: the paths the config names and the device it asks for, on this machine;
- `check_reward_file(cfg)`: the custom reward file imports and has its function;
- `claim_run_dir(cfg)`: a new run gets a directory of its own (a resumed one keeps its own);
- `user_error_message(e, cfg, config_path)`: the one-line message for a user error (config, data,
  paths, model directory, reward file, a full or read-only disk), or None for a bug in hybridrl.

Only the standard library is imported at the top: `import hybridrl` and the CLI's report and
dashboard commands stay free of torch.
"""

from __future__ import annotations

import errno
import os


class UsageError(ValueError):
    """A command-line argument that cannot be used (the CLI's own user error)."""


def trainer_class(cfg):
    """The trainer class of algorithm.name: PPOTrainer (rl), PreferenceTrainer (dpo, kto), SFTTrainer, RewardModelTrainer."""
    if cfg.algorithm.name in ("dpo", "kto"):
        from hybridrl.trainer.preference import PreferenceTrainer

        return PreferenceTrainer
    if cfg.algorithm.name == "sft":
        from hybridrl.trainer.sft import SFTTrainer

        return SFTTrainer
    if cfg.algorithm.name == "rm":
        from hybridrl.trainer.reward_training import RewardModelTrainer

        return RewardModelTrainer
    from hybridrl.trainer.ppo import PPOTrainer

    return PPOTrainer


def input_problems(cfg, in_memory_rm: bool = False) -> list[str]:
    """The paths the config names that do not exist here, and a device this machine lacks
    (`in_memory_rm`: the Python API holds the reward model as an object)."""
    from hybridrl.config.paths import missing_paths

    return missing_paths(cfg, in_memory_rm) + device_problems(cfg)


def device_problems(cfg) -> list[str]:
    """trainer.device=cuda on a machine whose torch sees no GPU (torch is imported only then)."""
    if cfg.trainer.device != "cuda":
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return [
        "trainer.device=cuda but torch sees no CUDA device on this machine (a CPU-only torch, or no GPU visible); "
        "use trainer.device=cpu or auto"
    ]


def check_reward_file(cfg) -> None:
    """Import the custom reward file once, before any model work: a file that raises on import
    (a missing module, a typo at top level) or lacks the function is a one-line config error."""
    from hybridrl.config import ConfigError
    from hybridrl.rewards import load_custom_reward_fn

    c = cfg.custom_reward_function
    if not c.path:
        return
    try:
        load_custom_reward_fn(c.path, c.name)
    except (Exception, SystemExit) as e:  # user code: whatever it raises is the user's to fix
        line = _user_code_line(e, c.path)
        raise ConfigError(
            [
                f"custom_reward_function.path={c.path!r}{line}: importing it raised {type(e).__name__}: "
                f"{_first_line(e)}; fix the file (HYBRIDRL_DEBUG=1 shows the traceback)"
            ]
        ) from e


def _user_code_line(e: BaseException, path: str) -> str:
    full = os.path.abspath(path)
    if isinstance(e, SyntaxError) and e.filename and os.path.abspath(e.filename) == full:
        return f", line {e.lineno}"
    tb, line = e.__traceback__, None
    while tb is not None:
        if os.path.abspath(tb.tb_frame.f_code.co_filename) == full:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f", line {line}" if line else ""


def claim_run_dir(cfg) -> None:
    """A run that does not resume starts in a directory holding no other run (trainer/rundir.py)."""
    from hybridrl.trainer import rundir
    from hybridrl.trainer.rundir import find_resume, run_dir

    if find_resume(cfg) is None:
        rundir.claim(run_dir(cfg), cfg.trainer.overwrite)


# Filesystem errors that are the machine's state, not a bug: what happened and what to do.
_FS_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


def user_error_message(e: BaseException, cfg=None, config_path: str | None = None) -> str | None:
    """The one-line message for a user error, or None when `e` is a bug (shown with its traceback)."""
    from hybridrl.config import ConfigError
    from hybridrl.data.errors import DataError
    from hybridrl.distributed.checkpoint import CheckpointError
    from hybridrl.distributed.groups import BackendError
    from hybridrl.models.loading import ModelLoadError
    from hybridrl.trainer.rundir import RunDirError

    if isinstance(e, CheckpointError):  # also from a Ray worker, where str(e) is the remote traceback
        return _one_line(e.args[0] if e.args else str(e))
    if isinstance(e, RunDirError):
        return _one_line(str(e))
    if isinstance(e, ConfigError):
        where = f"{config_path}: " if config_path else ""
        if len(e.errors) == 1 and config_path and e.errors[0].startswith(str(config_path)):
            where = ""  # the message already starts with the file (and its line)
        if len(e.errors) == 1:
            return _one_line(f"{where}{e.errors[0]}")
        problems = "; ".join(f"({i}) {err}" for i, err in enumerate(e.errors, 1))
        return _one_line(f"{len(e.errors)} problems in {config_path or 'the config'}: {problems}")
    if isinstance(e, (DataError, ModelLoadError, BackendError, UsageError, FileNotFoundError, NotImplementedError)):
        return _one_line(str(e))
    os_error = _os_error(e)
    if os_error is not None and os_error.errno in _FS_ERRORS:
        return _one_line(_fs_message(os_error, cfg))
    if isinstance(e, RuntimeError) and ("unexpected pos" in str(e) or "failed writing" in str(e)):
        # torch.save's writer reports a short write (a full disk) this way, not as an OSError.
        return _one_line(_fs_message(OSError(errno.ENOSPC, "short write", None), cfg))
    return None


def _os_error(e: BaseException) -> OSError | None:
    """The OSError behind `e`: itself, its cause/context, or one a checkpoint writer collected."""
    seen = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno is not None:
            return x
        todo += [x.__cause__, x.__context__]
        for failure in (getattr(x, "failures", None) or {}).values():  # torch.distributed.checkpoint
            todo += [f for f in (failure if isinstance(failure, tuple) else (failure,)) if isinstance(f, BaseException)]
    return None


def _last_checkpoint_state(cfg) -> str:
    from hybridrl.distributed.checkpoint import CheckpointError
    from hybridrl.trainer.checkpoint import latest_checkpoint
    from hybridrl.trainer.rundir import checkpoints_dir

    try:
        last = latest_checkpoint(checkpoints_dir(cfg))
    except CheckpointError:  # a bad `latest` pointer: that error is reported on its own
        return "the checkpoints' latest pointer is invalid"
    # Checkpoints are written to a temporary name and renamed when complete, so a failed or
    # interrupted write never touches the last complete one.
    return f"the last checkpoint {last} is intact" if last else "no checkpoint was written yet"


def checkpoint_note(cfg) -> str:
    return f"; {_last_checkpoint_state(cfg)} (trainer.resume_mode=auto continues from it)" if cfg is not None else ""


def _fs_message(e: OSError, cfg) -> str:
    what = _FS_ERRORS[e.errno]
    target = f" while writing {e.filename}" if e.filename else ""
    text = f"{what}{target}"
    if cfg is not None:
        state = _last_checkpoint_state(cfg)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"{text}; {state}: free some space and rerun with trainer.resume_mode=auto to continue from it"
        return f"{text}; {state}; make trainer.default_local_dir writable, or set it to a writable directory"
    return f"{text}; free some space or make the path writable"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
