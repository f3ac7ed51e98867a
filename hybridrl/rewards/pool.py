"""Run user code (reward functions; later agent tools and remote scorers) so that it cannot stop
or freeze the run.

`WorkerPool(target, kind="process" | "thread", num_workers, timeout_s).map(list_of_kwargs)`
calls `target(**kwargs)` for each item and returns one `Outcome` per item, in order. Each call
has `timeout_s`; a call that raises anything (also `SystemExit`, `KeyboardInterrupt`), hangs past
its timeout, or takes its process down (`os._exit`, a segfault, being killed) gives that item
an `Outcome` with `error` set, and the pool goes on: a hung or dead process is replaced.

- `kind="process"` (custom code): `target` is a `Target(path, name, kwargs)`, loaded inside each
  worker process; nothing from the user's file runs in the trainer.
- `kind="thread"` (the built-in scorers, trusted): `target` is a callable run by a thread of this
  process, the batch in order with no copying; a call past its timeout is abandoned (a thread
  cannot be killed) and the rest of the batch goes on in a fresh thread.

Items go to the worker processes in chunks (one message per chunk, one small reply per item),
so a batch of hundreds of cheap calls costs a few milliseconds of messaging.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

_SPAWN = mp.get_context("spawn")  # no fork of a trainer that holds threads, CUDA and locks


@dataclass(frozen=True)
class Target:
    """A function named `name` in the Python file `path`, called with `kwargs` bound."""

    path: str
    name: str
    kwargs: dict = field(default_factory=dict)

    def load(self) -> Callable:
        import functools

        from hybridrl.rewards.custom import load_custom_reward_fn

        fn = load_custom_reward_fn(self.path, self.name)
        return functools.partial(fn, **self.kwargs) if self.kwargs else fn


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None
    """None when the call returned; otherwise what went wrong (the traceback, or one line)."""
    timed_out: bool = False


def _serve(conn: Connection, target: Target) -> None:
    """A worker's loop: receive a chunk [(index, kwargs), ...], reply (index, ok, value) per item."""
    try:
        fn = target.load()
    except BaseException:
        conn.send(("load-failed", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for index, kwargs in chunk:
            try:
                reply = (index, True, fn(**kwargs))
            except BaseException:  # SystemExit and KeyboardInterrupt too: one sample, not the worker
                reply = (index, False, traceback.format_exc())
            try:
                conn.send(reply)
            except OSError:
                return  # the parent is gone
            except Exception:  # the value does not pickle
                conn.send((index, False, f"the reward function returned {type(reply[2]).__name__}, which cannot be sent back"))


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, target: Target):
        self.conn, child = _SPAWN.Pipe()
        self.proc = _SPAWN.Process(target=_serve, args=(child, target), daemon=True)
        self.proc.start()
        child.close()
        self.pending: deque[int] = deque()  # item indices sent and not answered, in order
        self.since = 0.0  # when the oldest pending item started (the last reply or the send)

    def start(self, timeout_s: float) -> None:
        """Wait for the worker to load its function; a RuntimeError with its traceback if it cannot."""
        if not self.conn.poll(timeout_s):
            self.stop()
            raise RuntimeError(f"a reward worker did not start within {timeout_s:.0f} s")
        try:
            msg = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"a reward worker exited while starting (exit code {self.exitcode()})") from None
        if msg[0] == "load-failed":
            raise RuntimeError(f"the reward function could not be loaded in its worker:\n{msg[1]}")

    def send(self, chunk: list[tuple[int, dict]]) -> None:
        self.pending.extend(i for i, _ in chunk)
        self.since = time.monotonic()
        self.conn.send(chunk)

    def exitcode(self):
        self.proc.join(timeout=1.0)
        return self.proc.exitcode

    def stop(self, kill: bool = False) -> None:
        if self.proc.is_alive():
            if kill:
                self.proc.kill()
            else:
                try:
                    self.conn.send(None)
                except OSError:
                    pass
                self.proc.join(timeout=2.0)
                if self.proc.is_alive():
                    self.proc.kill()
            self.proc.join(timeout=2.0)
        self.conn.close()


class _ThreadJob:
    """Calls of one batch run in order by one thread of this process; the parent watches
    `since` (when the current call started) to time a call out, then abandons the thread."""

    def __init__(self, fn, items: list[tuple[int, dict]], out: list, cond: threading.Condition):
        self.fn, self.items, self.out, self.cond = fn, items, out, cond
        self.pos, self.since, self.done, self.abandoned = 0, time.monotonic(), False, False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        for pos, (index, kwargs) in enumerate(self.items):
            with self.cond:
                if self.abandoned:
                    return
                self.pos, self.since = pos, time.monotonic()
            try:
                outcome = Outcome(value=self.fn(**kwargs))
            except BaseException:  # trusted code, but SystemExit / KeyboardInterrupt still cost one sample
                outcome = Outcome(error=traceback.format_exc())
            with self.cond:
                if self.abandoned:
                    return
                self.out[index] = outcome
        with self.cond:
            self.done = True
            self.cond.notify_all()


class WorkerPool:
    """See the module docstring. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        target,
        *,
        kind: str = "process",
        num_workers: int = 2,
        timeout_s: float = 10.0,
        chunk_size: int = 64,
        start_timeout_s: float = 120.0,
    ):
        if kind not in ("process", "thread"):
            raise ValueError(f"WorkerPool kind must be 'process' or 'thread', not {kind!r}")
        if kind == "process" and not isinstance(target, Target):
            raise TypeError("a process pool takes a Target(path, name, kwargs): the function is loaded in the workers")
        if not (timeout_s > 0) or num_workers < 1:
            raise ValueError(f"WorkerPool needs timeout_s > 0 and num_workers >= 1 (got {timeout_s}, {num_workers})")
        self.target, self.kind, self.timeout_s = target, kind, float(timeout_s)
        self.chunk_size, self.start_timeout_s = chunk_size, start_timeout_s
        self.replaced = 0
        """Workers replaced after a timeout or a death (threads: abandoned), over the pool's life."""
        self.workers = [_Worker(target) for _ in range(num_workers)] if kind == "process" else []
        try:
            for w in self.workers:
                w.start(start_timeout_s)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []

    def _replace(self, w: _Worker) -> _Worker:
        w.stop(kill=True)
        fresh = _Worker(self.target)
        fresh.start(self.start_timeout_s)
        self.workers[self.workers.index(w)] = fresh
        self.replaced += 1
        return fresh

    def map(self, items: list[dict]) -> list[Outcome]:
        """`target(**item)` for every item, in order; never raises for what the calls do."""
        if not items:
            return []
        return self._map_threads(items) if self.kind == "thread" else self._map_processes(items)

    def _map_threads(self, items: list[dict]) -> list[Outcome]:
        out: list[Outcome | None] = [None] * len(items)
        todo = list(enumerate(items))
        cond = threading.Condition()
        while todo:
            job = _ThreadJob(self.target, todo, out, cond)
            todo = []
            with cond:
                while not job.done:
                    late = time.monotonic() - job.since
                    if late < self.timeout_s:
                        cond.wait(self.timeout_s - late)
                        continue
                    job.abandoned = True  # its thread stays inside the hung call; nothing it returns is used
                    index = job.items[job.pos][0]
                    out[index] = Outcome(error=f"timed out after {self.timeout_s:g} s", timed_out=True)
                    todo = job.items[job.pos + 1 :]
                    self.replaced += 1
                    break
        return out  # type: ignore[return-value]

    def _map_processes(self, items: list[dict]) -> list[Outcome]:
        n = len(items)
        out: list[Outcome | None] = [None] * n
        size = max(1, min(self.chunk_size, -(-n // len(self.workers))))
        todo = deque([(i, items[i]) for i in range(start, min(start + size, n))] for start in range(0, n, size))
        left = n
        while left:
            for w in list(self.workers):  # every idle worker gets the next chunk
                if not w.pending and todo:
                    if not w.proc.is_alive():  # died between batches
                        w = self._replace(w)
                    w.send(todo.popleft())
            busy = [w for w in self.workers if w.pending]
            deadline = min(w.since for w in busy) + self.timeout_s
            waits = [w.conn for w in busy] + [w.proc.sentinel for w in busy]
            ready = wait(waits, timeout=max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            for w in busy:
                index = w.pending[0]
                failure = None
                if w.conn in ready:
                    try:
                        while w.pending and w.conn.poll():
                            i, ok, value = w.conn.recv()
                            out[i] = Outcome(value=value) if ok else Outcome(error=value)
                            w.pending.popleft()
                            left -= 1
                            w.since = time.monotonic()
                        continue
                    except (EOFError, OSError):
                        failure = Outcome(error=f"the reward worker exited during this call (exit code {w.exitcode()})")
                elif w.proc.sentinel in ready:
                    failure = Outcome(error=f"the reward worker exited during this call (exit code {w.exitcode()})")
                elif now - w.since >= self.timeout_s:
                    failure = Outcome(error=f"timed out after {self.timeout_s:g} s", timed_out=True)
                if failure is None:
                    continue
                index = w.pending[0] if w.pending else index
                out[index] = failure
                left -= 1
                rest = [(i, items[i]) for i in list(w.pending)[1:]]
                if rest:
                    todo.appendleft(rest)
                w.pending.clear()
                self._replace(w)
        return out  # type: ignore[return-value]
