"""Helpers shared by the end-to-end CLI tests: run `python -m hybridrl`, read what a run wrote."""

from __future__ import annotations

import json
import math
import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

VOLATILE = (
    "timing_s/",
    "perf/throughput",
    "perf/samples_per_s",
    "perf/rollout_tokens_per_s",
    "rollout/decode_ms_per_step",
    "agent/tool_wait_share",
    "rollout/extend_",  # wall-clock, and how answers arrive (which ones rejoin together)
    "agent/tool_latency_s",
    "rollout/graph_capture_s",
    "rollout/wake_s",  # where generation's time goes (wall-clock)
    "rollout/loop_s",
    "rollout/assemble_s",
    "rollout/sleep_s",
    "rollout/max_launch_gap_ms",
)  # wall-clock numbers differ between runs


def cli(*args, env=None, check=True, cwd=None, timeout=900):
    """`python -m hybridrl ARGS` -> CompletedProcess. On Linux the command runs in a process forked
    from a server that imported torch and transformers once (~7 s a command on the CI machine);
    HYBRIDRL_TEST_CLI=subprocess runs a fresh interpreter instead, exactly as a user would."""
    argv = [str(a) for a in args]
    full_env = {**os.environ, **(env or {})}
    if os.environ.get("HYBRIDRL_TEST_CLI", "fork") == "subprocess" or not sys.platform.startswith("linux"):
        proc = subprocess.run(
            [sys.executable, "-m", "hybridrl", *argv], capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd
        )
    else:
        proc = _forked(argv, full_env, cwd, timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


# What a `python -m hybridrl` process spends ~7 s importing on the CI machine, imported once by the
# fork server: libraries only, none that reads an environment variable a test varies (hybridrl
# itself is imported in each command's process).
PRELOAD = [
    "torch",
    "torch.distributed.checkpoint",
    "safetensors.torch",
    "yaml",
    "jinja2",
    "pyarrow",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.qwen2.modeling_qwen2",
]
_SERVER = None


def _server():
    global _SERVER
    if _SERVER is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        # The server inherits this environment: hybridrl.cli.main sets these before huggingface_hub
        # is imported (it reads them once), so the preloaded hub must see them too.
        saved = dict(os.environ)
        if os.environ.get("HYBRIDRL_ALLOW_HUB", "") not in ("1", "true", "yes"):
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _SERVER = ctx
    return _SERVER


def _forked(argv, env, cwd, timeout) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        p = _server().Process(target=_run_main, args=(argv, env, None if cwd is None else str(cwd), str(out), str(err)))
        p.start()
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            raise subprocess.TimeoutExpired(["hybridrl", *argv], timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(["hybridrl", *argv], p.exitcode, out.read_text(), err.read_text())


def _run_main(argv, env, cwd, out, err) -> None:
    """In the forked process: what `python -m hybridrl ARGV` would do with this environment."""
    import atexit
    import traceback

    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]  # read at startup by a fresh interpreter
    if env.get("OMP_NUM_THREADS"):  # OpenMP read it when torch loaded, in the server
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    if cwd is not None:
        os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    import hybridrl

    sys.argv = [str(Path(hybridrl.__file__).parent / "__main__.py"), *argv]
    code = 1
    try:
        from hybridrl.cli.main import main

        raise SystemExit(main(argv))  # as hybridrl/__main__.py: sys.exit(main())
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # os._exit below skips them (Ray's shutdown is one)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code)


def metrics(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


def weights(path) -> dict[str, torch.Tensor]:
    """The weights of an HF directory, or of a sharded checkpoint's role directory (exported)."""
    from hybridrl.distributed.checkpoint import export_hf, is_sharded_checkpoint

    if is_sharded_checkpoint(path):
        with tempfile.TemporaryDirectory() as tmp:
            return load_file(str(export_hf(path, tmp) / "model.safetensors"))
    return load_file(str(Path(path) / "model.safetensors"))


def assert_all_finite(rows) -> None:
    for row in rows:
        for k, v in row.items():
            assert isinstance(v, (int, float)) and math.isfinite(v), (row.get("step"), k, v)


def without_volatile(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(VOLATILE)}


def one_step_args(model, train, out, config_dir=None, **extra) -> list:
    """`hybridrl train` arguments of a one-step GRPO run of a tiny model on CPU (4 prompts x 2
    samples, responses of at most 4 tokens) from an empty config file; `extra`: more keys."""
    empty = Path(config_dir or Path(out).parent) / "empty.yaml"
    empty.write_text("{}\n")
    o = {
        "data.train_files": train,
        "data.train_batch_size": 4,
        "data.max_prompt_length": 8,
        "data.max_response_length": 4,
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.rollout.n": 2,
        "trainer.device": "cpu",
        "trainer.total_training_steps": 1,
        "trainer.default_local_dir": out,
        "trainer.logger": "[jsonl]",
        **extra,
    }
    return [empty, *(f"{k}={v}" for k, v in o.items())]
