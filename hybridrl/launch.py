"""One launch path for both front doors, the CLI (`hybridrl train`) and the Python API (`RLTrainer.fit`).

What a run needs checked before any model work, and how a failure reads, said once:

- `trainer_class(cfg)`: the trainer of algorithm.name;
- `input_problems(cfg)`: the paths the config names and the device it asks for, on this machine;
- `check_reward_file(cfg)`: the custom reward file imports and has its function;
- `claim_run_dir(cfg)`: a new run gets a directory of its own (a resumed one keeps its own);
- `user_error_message(e, cfg, config_path)`: the one-line message for a user error (config, data,
  paths, model directory, reward file, a full or read-only disk), or None for a bug in hybridrl;
- `train_in_process(...)`: the Python API's run, in the caller's process: the checks above, the
  objects it was given written under the run's `inputs/`, a reward function object tried once
  (`check_reward_object`), training, and the process left as it was found (`restored_process_state`);
- `stop_on_signals()`: SIGTERM and SIGHUP end the run as Ctrl-C does (`SignalStop`): the loggers
  and workers are closed, a message names the signal and the checkpoint to resume from.

Only the standard library is imported at the top: `import hybridrl` and the CLI's report and
dashboard commands stay free of torch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import sys
import threading


class UsageError(ValueError):
    """An argument that cannot be used: of a command line, or of the Python API (a model object without
    save_pretrained, rows that are not rows, a reward function that fails on the first row)."""


class SignalStop(KeyboardInterrupt):
    """The run was asked to stop by a signal (SIGTERM from a scheduler or `kill`, SIGHUP from a closed
    terminal). A KeyboardInterrupt, so that it unwinds exactly as Ctrl-C does: no handler of
    ordinary errors swallows it, and every finally block (loggers, workers, Ray) runs."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's status for a process ended by that signal


def _raise_stop(signum, frame) -> None:
    raise SignalStop(signum)


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM and SIGHUP raise SignalStop in the main thread while the block runs (where they
    would otherwise kill the process at once: no message, loggers not closed); handlers set
    before are put back after. Off the main thread (a notebook's worker thread) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in before.items():
        if handler in (signal.SIG_DFL, None):
            signal.signal(sig, _raise_stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            if handler is not None:
                signal.signal(sig, handler)


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


# --------------------------------------------------------------------------- the Python API's run


def train_in_process(cfg, make_trainer, *, write_inputs, reward_fn=None, in_memory_rm: bool = False) -> None:
    """Train `make_trainer(cfg)` in this process, as `hybridrl train` would, for the Python API.

    `write_inputs()` saves the objects the config names under the run's inputs/, after the run directory
    is claimed (overwrite moves an old run aside first); `reward_fn`: a reward function object, tried once
    before any model work; `in_memory_rm`: the reward model is an object, not a path."""
    from hybridrl.config import ConfigError
    from hybridrl.trainer import rundir
    from hybridrl.trainer.rundir import run_dir
    from hybridrl.trainer.supervise import fit_with_restarts

    out = run_dir(cfg)
    preflight(cfg)  # under torchrun, a missing wandb: one line, before any file is written
    # the lock first: a run refused because another thread holds the directory leaves the process
    # state (Ray, torch.distributed, RNG, environment) of the run in that thread alone
    with rundir.locked(out), restored_process_state():
        claim_run_dir(cfg)  # before inputs/ is written: overwrite moves the old run aside
        write_inputs()
        problems = input_problems(cfg, in_memory_rm=in_memory_rm)
        if problems:
            raise ConfigError(problems)
        for n in cfg.notices:  # what `hybridrl train` prints once at start
            print(f"hybridrl: notice: {n}", file=sys.stderr)
        if reward_fn is None:
            check_reward_file(cfg)
        else:
            check_reward_object(reward_fn, cfg)
        with stop_on_signals():  # SIGTERM / SIGHUP: SignalStop, which unwinds like Ctrl-C
            fit_with_restarts(cfg, make_trainer)


def preflight(cfg) -> None:
    """What `hybridrl train` refuses before reading anything: a launcher it cannot run under, a logger
    backend that is not installed; then Hub ids become local snapshots (HYBRIDRL_ALLOW_HUB=1)."""
    from hybridrl.preflight import backend_problems, launcher_refusal

    if refusal := launcher_refusal():
        raise UsageError(refusal)
    if problems := backend_problems(cfg):
        raise UsageError("; ".join(problems))
    from hybridrl.config.hub import fetch_repo_ids

    fetch_repo_ids(cfg)


def check_reward_object(fn, cfg) -> None:
    """Call a reward function object once on the first training row, its ground truth as the response, before
    any model work: a function with the wrong signature or a bug fails here, in one line, not as a run
    that scores every response 0 (in training, a call that raises scores 0 and counts in reward/errors).
    The call is isolated as in training (hybridrl/rewards/assembly.py): one that hangs, exits or runs out
    of memory fails here in one line too."""
    from hybridrl.data.converters import read_rows
    from hybridrl.rewards.assembly import call_once
    from hybridrl.rewards.result import as_number
    from hybridrl.rewards.trl import TRLRewards

    files = cfg.data.train_files
    row = read_rows(files if isinstance(files, str) else files[0])[0]
    c = cfg.custom_reward_function
    if isinstance(fn, TRLRewards):
        try:
            fn.probe(row, c.timeout_s, c.memory_limit_mb)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return
    truth = (row.get("reward_model") or {}).get("ground_truth") if isinstance(row.get("reward_model"), dict) else None
    call = {"data_source": row.get(cfg.data.reward_fn_key), "solution_str": str(truth), "ground_truth": truth}
    call["extra_info"] = row.get("extra_info") or {}
    try:
        outcome = call_once(cfg, fn, call)
    except TypeError as e:
        raise UsageError(str(e)) from None
    if outcome is None:
        return  # a Scorer of its own (a service): its failures are counted, never fatal
    name = getattr(fn, "__name__", type(fn).__name__)
    shown = f"data_source={call['data_source']!r}, solution_str={call['solution_str']!r}, ground_truth={truth!r}"
    if outcome.error is not None:
        last = outcome.error.strip().splitlines()[-1]
        raise UsageError(
            f"reward_fn {name}({shown}) on the first training row failed: {last}; it must take (data_source, "
            f"solution_str, ground_truth, extra_info) and return a number or a dict with a numeric 'score' "
            f"(a batched function takes lists: hybridrl.batched_reward)"
        )
    value = outcome.value
    score = value.get("score") if isinstance(value, dict) else value
    if as_number(score) is None:
        raise UsageError(
            f"reward_fn {name}({shown}) returned {value!r:.80}; return a finite number or a dict with a numeric 'score'"
        )


@contextlib.contextmanager
def restored_process_state():
    """What a run changes in this process, put back afterwards: RNG states, environment variables,
    torch's thread count and default dtype, the once-per-process reward-failure log, SIGTERM/SIGHUP
    handlers, and a Ray cluster or torch.distributed group that the run started."""
    import numpy as np
    import torch
    import torch.distributed as dist

    from hybridrl.models.loading import hub_offline_by_default
    from hybridrl.rewards.result import reset_error_log

    env = dict(os.environ)
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    ray_was_up = _ray_is_up()
    dist_was_up = dist.is_available() and dist.is_initialized()
    reset_error_log()  # each run logs its first reward failure
    hub_offline_by_default()  # as the CLI: local model directories, no minute of Hub retries on a typo
    try:
        yield
    finally:
        if _ray_is_up() and not ray_was_up:
            import ray

            ray.shutdown()
        if dist.is_available() and dist.is_initialized() and not dist_was_up:
            dist.destroy_process_group()
        for sig, handler in handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                with contextlib.suppress(ValueError):  # not the main thread
                    signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(env)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)


def _ray_is_up() -> bool:
    ray = sys.modules.get("ray")  # never imported: never started
    return ray is not None and ray.is_initialized()
