"""Run user code (reward functions; later agent tools and remote scorers) so that it cannot stop
or freeze the run.

`WorkerPool(target, kind="process" | "fork" | "thread", num_workers, timeout_s).map(list_of_kwargs)`
calls `target(**kwargs)` for each item and returns one `Outcome` per item, in order. Each call
has `timeout_s`; a call that raises anything (also `SystemExit`, `KeyboardInterrupt`), hangs past
its timeout, or takes its process down (`os._exit`, a segfault, being killed) gives that item
an `Outcome` with `error` set, and the pool goes on: a hung or dead process is replaced.

- `kind="process"` (custom code): `target` is a `Target(path, name, kwargs)`, loaded inside each
  worker process; nothing from the user's file runs in the trainer.
- `kind="fork"` (a function given in Python, e.g. to the Python API: a lambda, a closure, a function
  of a script or a notebook): `target` is the callable itself; each worker is a fork of this
  process, so the function needs no pickling and no import, and is bounded like the above.
- `kind="thread"` (the built-in scorers, trusted): `target` is a callable run by a thread of this
  process, the batch in order with no copying; a call past its timeout is abandoned (a thread
  cannot be killed) and the rest of the batch goes on in a fresh thread.

Items go to the worker processes in chunks (one message per chunk, one small reply per item),
so a batch of hundreds of cheap calls costs a few milliseconds of messaging.

What a worker process may do to the machine is bounded too:
- it dies with the process that started it (Linux: the parent-death signal), so no worker outlives
  a trainer that was killed;
- it leads its own session and process group, and stopping it kills the whole group; processes that
  left the group (a double fork and `setsid`) are found by what they inherit, a marker in their
  environment (`HYBRIDRL_REWARD_WORKER`, passed on by exec) or the worker's tag descriptor (passed
  on by fork), and killed with it (Linux: read from /proc);
- its address space is limited (`RLIMIT_AS`, `memory_limit_mb`; a forked worker may add that much
  to what it inherited): an allocation past it raises MemoryError in that call, which costs one sample;
- what it prints is counted (`Outcome.output_bytes`, reward/output_bytes) and at most
  `OUTPUT_SHOWN_PER_CALL` bytes of each call (`OUTPUT_SHOWN_PER_WORKER` over a worker's life) reach the console.

An `async def` reward function (or one returning an awaitable) is awaited: each call runs it to
completion in an event loop of its own.
"""

from __future__ import annotations

import asyncio
import fcntl
import inspect
import multiprocessing as mp
import os
import secrets
import signal
import sys
import threading
import time
import traceback
import warnings
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

from .result import Outcome

_SPAWN = mp.get_context("spawn")  # a file's function: a fresh interpreter, nothing of the trainer's state
# A function given in Python exists only in this process's memory: its workers are forks. They run the
# function alone (one thread, no CUDA calls); a lock another thread held at the fork can only hang a
# call, which the timeout ends and a fresh fork replaces.
_FORK = mp.get_context("fork")


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


@dataclass(frozen=True)
class _InMemory:
    """A fork pool's target: the function itself, inherited by each forked worker."""

    fn: Callable

    def load(self) -> Callable:
        return self.fn


MARKER_ENV = "HYBRIDRL_REWARD_WORKER"  # set in each worker's environment; its descendants inherit it
OUTPUT_SHOWN_PER_CALL = 1024  # bytes of a call's output shown on the console
OUTPUT_SHOWN_PER_WORKER = 64 * 1024  # over a worker's life; the rest is only counted


def call(fn: Callable, kwargs: dict) -> Any:
    """`fn(**kwargs)`, awaited when it is a coroutine function or returns an awaitable (a reward
    written `async def` for an HTTP judge). Each call gets its own event loop."""
    value = fn(**kwargs)
    if inspect.isawaitable(value):
        return asyncio.run(_awaited(value))
    return value


async def _awaited(value):
    return await value


def _isolate(memory_limit_mb: int | None, marker: str, parent: int, forked: bool) -> str | None:
    """In a fresh worker, before any user code: death with `parent` (the pool's process), own session
    (so the group can be killed whole), default signal handlers (a fork inherits the trainer's), the
    environment marker, the tag descriptor, and the address-space limit. Returns the tag's identity
    in /proc (None where there is no /proc)."""
    _die_with_parent(parent)
    os.setsid()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ[MARKER_ENV] = marker
    if forked and "torch" in sys.modules:  # the trainer's OpenMP pool does not survive a fork (as DataLoader workers do)
        sys.modules["torch"].set_num_threads(1)
    tag, _ = os.pipe()  # inherited by every fork (never used): what a forked descendant still holds
    os.set_inheritable(tag, True)
    try:
        identity = os.readlink(f"/proc/self/fd/{tag}")
    except OSError:
        identity = None
    if memory_limit_mb:
        import resource

        # A fork starts with the trainer's address space mapped (torch, maybe CUDA's reservations):
        # it may grow by memory_limit_mb from there.
        limit = int(memory_limit_mb) * 2**20 + (_mapped_bytes() if forked else 0)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ValueError, OSError):  # macOS refuses RLIMIT_AS: the timeout still bounds a call
            pass
    return identity


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` dies (Linux's PR_SET_PDEATHSIG), even inside a hung call
    that holds the interpreter; exit now if it already has."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the pool's close() still ends its workers
        pass
    if os.getppid() != parent:
        os._exit(1)


def _mapped_bytes() -> int:
    """This process's mapped address space (VmSize), in bytes; 0 where /proc is missing."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Output:
    """The worker's stdout and stderr (fds 1 and 2, so child processes and C code too) go to an
    append-only temporary file; after each call its size is counted and a capped part shown."""

    def __init__(self):
        import tempfile

        self.console = os.fdopen(os.dup(2), "w", errors="replace")
        self.file = tempfile.TemporaryFile()
        flags = fcntl.fcntl(self.file.fileno(), fcntl.F_GETFL)
        fcntl.fcntl(self.file.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)  # writes after a truncate start at 0
        for fd in (1, 2):
            os.dup2(self.file.fileno(), fd)
        # Python's own streams on those fds: a fork inherits the trainer's sys.stdout, which may write
        # elsewhere (a notebook's sends to the kernel's threads, which a fork does not have).
        sys.stdout = open(1, "w", buffering=1, errors="replace", closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="replace", closefd=False)
        self.shown = 0

    def collect(self) -> int:
        """Bytes written since the last collect; shows at most the caps, then empties the file."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        fd = self.file.fileno()
        size = os.fstat(fd).st_size
        if size:
            room = min(OUTPUT_SHOWN_PER_CALL, OUTPUT_SHOWN_PER_WORKER - self.shown)
            if room > 0:
                head = os.pread(fd, room, 0).decode(errors="replace")
                more = f" [... {size - room} more bytes not shown]" if size > room else ""
                if self.shown + room >= OUTPUT_SHOWN_PER_WORKER:
                    more += " [this worker's later output is counted in reward/output_bytes, not shown]"
                self.console.write(f"[reward worker {os.getpid()}] {head.rstrip()}{more}\n")
                self.console.flush()
                self.shown += room
            os.ftruncate(fd, 0)
        return size


def _serve(
    conn: Connection,
    target: Target | _InMemory,
    memory_limit_mb: int | None,
    marker: str,
    parent: int,
    forked: bool = False,
    inherited: tuple[Connection, ...] = (),
) -> None:
    """A worker's loop: receive a chunk [(index, kwargs), ...], reply (index, ok, value, output bytes) per item.
    `inherited` (a fork): the pool's ends of its pipes, which the fork holds copies of and closes, so
    that a pipe whose pool end is closed reads as closed."""
    for other in inherited:
        other.close()
    try:
        tag = _isolate(memory_limit_mb, marker, parent, forked)
        output = _Output()
        fn = target.load()
    except BaseException:
        conn.send(("load-failed", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid(), tag))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for index, kwargs in chunk:
            try:
                reply = (index, True, call(fn, kwargs))
            except MemoryError:
                reply = (
                    index,
                    False,
                    f"MemoryError: the call ran out of its {memory_limit_mb} MB (custom_reward_function.memory_limit_mb)",
                )
            except BaseException:  # SystemExit and KeyboardInterrupt too: one sample, not the worker
                reply = (index, False, traceback.format_exc())
            reply = (*reply, output.collect())
            try:
                conn.send(reply)
            except OSError:
                return  # the parent is gone
            except Exception:  # the value does not pickle
                conn.send(
                    (index, False, f"the reward function returned {type(reply[2]).__name__}, which cannot be sent back", reply[3])
                )


def _kill_marked(marker: str, tag: str | None) -> int:
    """SIGKILL every process whose environment carries `marker` or that holds the descriptor `tag`
    (a worker's descendants that left its process group); returns how many. Reads /proc (Linux);
    elsewhere nothing is found."""
    needle = f"{MARKER_ENV}={marker}\0".encode()
    killed = 0
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            if not _marked(pid, needle, tag):
                continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except OSError:  # gone, or not ours to read
            continue
    return killed


def _marked(pid: int, needle: bytes, tag: str | None) -> bool:
    with open(f"/proc/{pid}/environ", "rb") as f:
        if needle in f.read() + b"\0":
            return True
    if tag is None:
        return False
    fds = f"/proc/{pid}/fd"
    for fd in os.listdir(fds):
        try:
            if os.readlink(f"{fds}/{fd}") == tag:
                return True
        except OSError:
            continue
    return False


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, target: Target | _InMemory, memory_limit_mb: int | None, forked: bool, siblings: tuple = ()):
        """`forked`: a fork of this process (`target` in memory), else a spawned interpreter that loads
        `target`. `siblings`: the pool's other workers (a fork closes its copies of their pipes)."""
        context = _FORK if forked else _SPAWN
        self.conn, child = context.Pipe()
        self.marker = f"{os.getpid()}-{secrets.token_hex(8)}"
        inherited = (self.conn, *(w.conn for w in siblings)) if forked else ()
        args = (child, target, memory_limit_mb, self.marker, os.getpid(), forked, inherited)
        self.proc = context.Process(target=_serve, args=args, daemon=True)
        with warnings.catch_warnings():  # Python >= 3.12 warns on any fork of a process with threads (see _FORK)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.proc.start()
        child.close()
        self.tag: str | None = None  # the worker's tag descriptor in /proc, once it is ready
        self._stop_lock = threading.Lock()  # `close` and a `map` replacing this worker may stop it at once
        self.stopped = False
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
        self.tag = msg[2]

    def send(self, chunk: list[tuple[int, dict]]) -> None:
        self.pending.extend(i for i, _ in chunk)
        self.since = time.monotonic()
        self.conn.send(chunk)

    def exitcode(self):
        self.proc.join(timeout=1.0)
        return self.proc.exitcode

    def stop(self, kill: bool = False) -> None:
        """End the worker and everything it started: its process group, then any process that left
        the group but carries the worker's environment marker. Runs once: a second call, from
        another thread too, waits for the first and returns."""
        with self._stop_lock:
            if not self.stopped:
                try:
                    self._stop(kill)
                finally:
                    self.stopped = True

    def _stop(self, kill: bool) -> None:
        if self.proc.is_alive() and not kill:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.proc.join(timeout=2.0)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker leads its group (os.setsid in _isolate)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=2.0)
        _kill_marked(self.marker, self.tag)
        self.conn.close()


def _closed() -> RuntimeError:
    return RuntimeError("the reward pool was closed (the run is ending) while it scored a batch")


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
                outcome = Outcome(value=call(self.fn, kwargs))
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
        memory_limit_mb: int | None = None,
    ):
        if kind not in ("process", "fork", "thread"):
            raise ValueError(f"WorkerPool kind must be 'process', 'fork' or 'thread', not {kind!r}")
        if kind == "process" and not isinstance(target, Target):
            raise TypeError("a process pool takes a Target(path, name, kwargs): the function is loaded in the workers")
        if kind != "process" and not callable(target):
            raise TypeError(f"a {kind} pool takes the function itself, got {type(target).__name__}")
        if not (timeout_s > 0) or num_workers < 1:
            raise ValueError(f"WorkerPool needs timeout_s > 0 and num_workers >= 1 (got {timeout_s}, {num_workers})")
        self.target, self.kind, self.timeout_s = target, kind, float(timeout_s)
        self.chunk_size, self.start_timeout_s, self.memory_limit_mb = chunk_size, start_timeout_s, memory_limit_mb
        self.replaced = 0
        """Workers replaced after a timeout or a death (threads: abandoned), over the pool's life."""
        self.workers: list[_Worker] = []
        self.closed = False
        self._lock = threading.Lock()  # `close` against a `map` that replaces a worker in another thread
        try:
            for _ in range(num_workers if kind != "thread" else 0):
                self.workers.append(self._new_worker())
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
        """Stop every worker, also in the middle of a `map` in another thread (which then raises
        RuntimeError): nothing the pool started outlives it. A worker inside a call is killed at once."""
        with self._lock:
            self.closed = True
            workers, self.workers = self.workers, []
        failed = None
        for w in workers:  # every worker, also when stopping one fails
            try:
                w.stop(kill=bool(w.pending))
            except Exception as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def _new_worker(self) -> _Worker:
        forked = self.kind == "fork"
        target = _InMemory(self.target) if forked else self.target
        return _Worker(target, self.memory_limit_mb, forked, siblings=tuple(self.workers))

    def _replace(self, w: _Worker) -> _Worker:
        if self.closed:  # `close` owns the workers now
            raise _closed()
        w.stop(kill=True)
        with self._lock:
            if self.closed:
                raise _closed()
            fresh = self._new_worker()
            fresh.start(self.start_timeout_s)
            self.workers[self.workers.index(w)] = fresh
        self.replaced += 1
        return fresh

    def map(self, items: list[dict]) -> list[Outcome]:
        """`target(**item)` for every item, in order; never raises for what the calls do (a closed
        pool raises RuntimeError)."""
        if self.closed:
            raise _closed()
        if not items:
            return []
        if self.kind == "thread":
            return self._map_threads(items)
        try:
            return self._map_processes(items)
        except (OSError, ValueError, EOFError):  # the pipes of a pool closed meanwhile
            if self.closed:
                raise _closed() from None
            raise

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
            if self.closed:
                raise _closed()
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
                            i, ok, value, printed = w.conn.recv()
                            out[i] = (
                                Outcome(value=value, output_bytes=printed) if ok else Outcome(error=value, output_bytes=printed)
                            )
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
