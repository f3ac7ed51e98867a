"""The remote scorer's requests, made by a helper process (`RemoteReward(url, process=True)`).

A request is Python work: JSON, `urllib`, `http.client` parsing, a thread waking per answer. In
the trainer's process that work takes the interpreter from whatever else runs there; while the
batch is still decoding (scoring during generation, rewards/stream.py) it slowed each
decode step by a quarter (BENCHMARKS.md). Here the requests run in a child process, with the same
timeouts, retries and circuit breaker (a `RemoteReward` with threads, in the child); the trainer
only pickles each payload into a pipe, and a reader thread resolves its future from the answer.

The child is `python -m hybridrl.rewards.remote_process MODULE:FUNCTION READ_FD WRITE_FD`, not a
multiprocessing spawn: spawning re-imports the parent's `__main__`, which a user's script without a
main guard cannot survive. FUNCTION (`remote.serve_requests`) reads the settings and then the
requests from READ_FD and writes each answer's `Outcome` to WRITE_FD; the child imports the reward
modules only (no torch). If it dies, the requests in flight score 0 as errors (`reward/errors`) and
the next request starts a new one; if it cannot start at all, `RemoteReward` makes its requests
from threads of the trainer, with a warning.
"""

from __future__ import annotations

import concurrent.futures as cf
import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from .result import Outcome

__all__ = ["RequestProcess"]


class RequestProcess:
    """A child process running `entry` ("module:function") to make a `RemoteReward`'s requests;
    `submit(payload)` returns a Future of its `Outcome`. `failed(message)`: the `Outcome` of a
    request the child could not answer (it exited, or the payload does not pickle)."""

    def __init__(self, settings: dict, entry: str, failed: Callable[[str], Outcome], start_timeout_s: float = 60.0):
        to_child, child_reads = _pipe()
        child_writes, from_child = _pipe()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the hybridrl package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hybridrl.rewards.remote_process", entry, str(child_reads), str(child_writes)],
            pass_fds=(child_reads, child_writes),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        os.close(child_reads)
        os.close(child_writes)
        self._requests = Connection(to_child, readable=False)
        self._replies = Connection(from_child, writable=False)
        self._failed = failed
        self._futures: dict[int, cf.Future] = {}
        self._lock = threading.Lock()  # the futures and the request pipe
        self._next = 0
        try:
            self._requests.send(settings)
        except OSError:  # a broken pipe: the child is exiting before it read them
            self._not_started(wait_s=min(start_timeout_s, 10.0))
        self._wait_ready(start_timeout_s)
        self.alive = True
        self._reader = threading.Thread(target=self._read, name="hybridrl-remote-reward-replies", daemon=True)
        self._reader.start()

    def _wait_ready(self, timeout_s: float) -> None:
        """The child's first message says it runs; a RuntimeError with its exit code if it does not."""
        try:
            ready = self._replies.poll(timeout_s) and self._replies.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._not_started(wait_s=0.0)

    def _not_started(self, wait_s: float) -> None:
        """Raise a RuntimeError with the child's exit code (waiting up to `wait_s` for it to
        exit on its own, then killing it); close both pipes."""
        try:
            code = self.proc.wait(timeout=wait_s) if wait_s > 0 else None
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            self.proc.kill()
            code = self.proc.wait()
        self._requests.close()
        self._replies.close()
        raise RuntimeError(f"the remote scorer's request process did not start (exit code {code}; its error is above)")

    def submit(self, payload: dict) -> cf.Future:
        future: cf.Future = cf.Future()
        with self._lock:
            if self.alive:
                index, self._next = self._next, self._next + 1
                self._futures[index] = future
                try:
                    self._requests.send((index, payload))
                    return future
                except OSError:  # the child is gone; the reader fails what was in flight
                    self._futures.pop(index, None)
                    self.alive = False
                except Exception as e:  # noqa: BLE001  this payload does not pickle: it scores 0 as an error
                    self._futures.pop(index, None)
                    future.set_result(self._failed(f"cannot send this response to the request process: {e}"))
                    return future
        future.set_result(self._gone())
        return future

    def _read(self) -> None:
        while True:
            try:
                index, outcome = self._replies.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                future = self._futures.pop(index, None)
            if future is not None:
                future.set_result(outcome)
        with self._lock:
            self.alive = False
            pending, self._futures = self._futures, {}
        for future in pending.values():
            future.set_result(self._gone())

    def _gone(self) -> Outcome:
        return self._failed(f"the remote scorer's request process exited (exit code {self.proc.poll()})")

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the requests in flight finish (up to `timeout_s`), then stop the child."""
        with self._lock:
            try:
                self._requests.send(None)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=timeout_s)
        self._requests.close()


def _pipe() -> tuple[int, int]:
    """(write end, read end) of a pipe whose ends survive into a child via pass_fds."""
    read, write = os.pipe()
    return write, read


if __name__ == "__main__":
    module, _, function = sys.argv[1].partition(":")
    serve = getattr(importlib.import_module(module), function)
    serve(Connection(int(sys.argv[2]), writable=False), Connection(int(sys.argv[3]), readable=False))
