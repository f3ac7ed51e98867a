"""Running untrusted Python (the model's code) without letting it escape or stall the run.

`LocalSandbox.run(code)` executes one snippet in a fresh process and returns what it printed.
The kernel is the boundary (docs/sandbox.md has the table and the reasons):

- **its own namespaces**: new user, mount, PID, network, IPC and UTS namespaces. The snippet
  sees a read-only root that holds only `/usr`, the Python install and its virtualenv, and a
  private size-limited tmpfs as its working directory: nothing of the trainer's models,
  checkpoints or run directories, no `/etc`, no host `/proc` (a fresh one of its own PID
  namespace), no network (a loopback that is down);
- **an unprivileged uid**: the snippet runs as uid 65534 (nobody) of its user namespace, mapped
  to the host's nobody when the trainer is root (else to the trainer's own uid), with no
  capabilities and `no_new_privs`;
- **one process tree, counted and killed whole**: it is PID 1 of its PID namespace and leads a
  session of its own (its signals to its process group never reach the setup); its own cgroup
  (cgroup.py: `memory.max`, `pids.max`) counts memory and processes over the whole tree, memfd and
  tmpfs pages included; RLIMIT_NPROC (per user namespace since Linux 5.14) bounds it too. The
  trainer holds a pidfd of PID 1 and keeps the wall clock itself: at `wall_timeout_s` from the
  snippet's start, or when the setup dies, it kills PID 1 (the kernel kills the rest of the
  namespace) and the cgroup, and `run` returns only once all of it is gone;
- **resource limits**: CPU seconds, address space, file size, open files (setrlimit), and disk
  (`max_disk_mb`, the tmpfs size);
- **no keyring**: a fresh session keyring instead of the trainer's, and a seccomp filter that
  refuses the key syscalls (seccomp.py);
- **an empty environment** and **bounded output** (stdout and stderr cut at `max_output_bytes`);
- **bounded concurrency**: at most `max_concurrency` snippets at once; `run` never blocks the
  event loop.

A second line, not a boundary: an audit hook in the snippet's interpreter refuses process
spawning, ctypes calls, sockets and writes outside the working directory, so a model's mistake
fails with a readable message. Where the kernel refuses the namespaces, the sandbox refuses to
start, unless `allow_unsafe_fallback` is set (then only the limits, the cgroup where there is one,
the keyring filter and the hook hold). Where no cgroup can be made, memory and processes are
limited per process only (docs/sandbox.md, "Where no cgroup can be made").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from . import launcher, setup_child
from .cgroup import SnippetCgroup, cgroup_available, cgroup_places
from .config import SandboxConfig, SandboxResult, SandboxUnavailable
from .seccomp import KEY_SYSCALLS, keyring_filter
from .setup_child import EXIT_SETUP_FAILED

SANDBOX_UID = 65534  # nobody (overflowuid) inside the user namespace, and on the host when the trainer is root
# pivot_root(2) has no glibc wrapper: its syscall number per architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
# The two child programs run from their source (`python -c`): the setup before the sandbox exists, the launcher
# inside a root that does not hold hybridrl.
_SETUP = Path(setup_child.__file__).read_text()
_LAUNCHER = Path(launcher.__file__).read_text()

CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWNS = 0x00020000
NAMESPACE_FLAGS = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")  # bound without nodev
_AUDIT_HOOK = True  # the second line; tests switch it off to show the kernel holds alone
_SETUP_TIMEOUT_S = 10.0  # from the spawn to the snippet's start (two interpreter start-ups, a few mounts)
_SETUP_CLOCK_SLACK_S = 1.0  # C's backstop clock runs this much past the trainer's


def _processes_of(uid: int) -> int:
    """How many processes `uid` runs now (the fallback's RLIMIT_NPROC counts them all)."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n


def _root_plan() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """What the sandbox's root holds: read-only binds (source, destination) of /usr, the loader's
    cache and the Python install with its virtualenv; symlinks for a merged /usr (/lib -> usr/lib)."""
    binds, symlinks = [("/usr", "/usr")], []
    for name in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(name):
            symlinks.append((name, os.readlink(name)))
        elif os.path.isdir(name):
            binds.append((name, name))
    for path in ("/etc/ld.so.cache", *_DEVICES):
        if os.path.exists(path):
            binds.append((path, path))
    prefix = os.path.abspath(sys.prefix)  # the venv, at the path its interpreter is started by
    for src, dst in ((os.path.realpath(sys.base_prefix),) * 2, (os.path.realpath(prefix), prefix)):
        binds.append((src, dst))
    exe_dir = os.path.dirname(os.path.realpath(sys.executable))
    binds.append((exe_dir, exe_dir))
    kept: list[tuple[str, str]] = []
    for src, dst in sorted(set(binds), key=lambda b: len(b[1])):  # drop what an earlier bind holds already
        if not any(dst == d or dst.startswith(d.rstrip("/") + "/") for _, d in kept) and os.path.exists(src):
            kept.append((src, dst))
    return kept, symlinks


def _spawn_plan(code: str, c: SandboxConfig, isolate: bool, workdir: str | None, status_fd: int, cgroup_procs: list[str]):
    """(argv, fds the setup inherits: closed here once it has started)."""
    code_fd = os.memfd_create("hybridrl-snippet")
    data = code.encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(code_fd, data) :]
    os.lseek(code_fd, 0, os.SEEK_SET)
    binds, symlinks = _root_plan() if isolate else ([], [])
    nproc = c.max_processes + 2 if isolate else _processes_of(os.geteuid()) + c.max_processes + 3
    seccomp = keyring_filter()
    plan = {
        "code_fd": code_fd,
        "status_fd": status_fd,
        "isolate": isolate,
        "flags": NAMESPACE_FLAGS,
        "setuid": os.geteuid() == 0,  # root maps the snippet to the host's nobody; anyone else to itself
        "uid": SANDBOX_UID,
        "gid": SANDBOX_UID,
        "binds": binds,
        "symlinks": symlinks,
        "sys_pivot_root": _SYS_PIVOT_ROOT.get(platform.machine(), -1),
        "sys_keyctl": KEY_SYSCALLS.get(platform.machine(), (None,) * 3)[2],
        "seccomp": seccomp.hex() if seccomp else None,
        "cgroup_procs": cgroup_procs,
        "cpu_s": c.cpu_s,
        "memory_mb": c.memory_mb,
        "max_file_mb": c.max_file_mb,
        "max_disk_mb": c.max_disk_mb,
        "max_open_files": c.max_open_files,
        "nproc": nproc,
        "timeout_s": c.wall_timeout_s + _SETUP_CLOCK_SLACK_S,
        "workdir": workdir,
        "python": sys.executable,
        "launcher_args": [str(_AUDIT_HOOK), str(c.max_processes)],  # launcher.py's AUDIT and MAX_FORKS
        "env": {
            "PATH": "/usr/bin:/bin",
            "HOME": workdir or "/sandbox",
            "TMPDIR": workdir or "/sandbox",
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        },
    }
    argv = [sys.executable, "-I", "-S", "-c", _SETUP, _LAUNCHER, json.dumps(plan)]  # -S: the setup needs no site-packages
    return argv, (code_fd, status_fd)


def namespaces_available() -> str | None:
    """None when a snippet can run fully isolated here, else why not."""
    import subprocess

    if sys.platform != "linux":
        return f"it runs on Linux only, not {sys.platform}"
    if platform.machine() not in _SYS_PIVOT_ROOT:
        return f"pivot_root's syscall number is not known for {platform.machine()}"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    status = _Status(ours)
    argv, pass_fds = _spawn_plan("pass", SandboxConfig(max_concurrency=1), True, None, theirs.fileno(), [])
    try:
        r = subprocess.run(argv, capture_output=True, timeout=30, pass_fds=pass_fds, cwd="/", env={"LANG": "C.UTF-8"})
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        os.close(pass_fds[0])
        theirs.close()
        while not status.ended and status.take_one():  # its pidfd, to close
            pass
        status.close()
    if r.returncode != 0:
        why = r.stderr.decode("utf-8", "replace").strip().splitlines()
        return why[-1] if why else f"the probe exited with {r.returncode}"
    return None


_NAMESPACES: dict[str, str | None] = {}
_WARNED: list[bool] = []
logger = logging.getLogger("hybridrl.sandbox")


class LocalSandbox:
    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        if "probe" not in _NAMESPACES:
            _NAMESPACES["probe"] = namespaces_available()
        self.isolated = _NAMESPACES["probe"] is None
        if sys.platform != "linux":
            raise SandboxUnavailable(
                f"the local code sandbox runs on Linux only; on {sys.platform}, use a SandboxFusion service "
                f"(the python tool's sandbox_fusion_url)"
            )
        if not self.isolated and not self.config.allow_unsafe_fallback:
            raise SandboxUnavailable(
                f"the code sandbox needs Linux user, mount, PID and network namespaces, and this machine refuses them "
                f"({_NAMESPACES['probe']}). Allow them (e.g. sysctl kernel.unprivileged_userns_clone=1, or run where "
                f"containers permit unshare), use a SandboxFusion service (the python tool's sandbox_fusion_url), "
                f"or set the python tool's config allow_unsafe_fallback: true to run with resource limits and an "
                f"audit hook only (no kernel isolation)"
            )
        # where each snippet gets a cgroup of its own ([]: per-process limits only; docs/sandbox.md)
        self.cgroups = cgroup_places()
        if not self.cgroups and not _WARNED:
            _WARNED.append(True)
            logger.warning(
                "code sandbox: no per-snippet cgroup here (%s); memory_mb and max_processes hold per process "
                "only (docs/sandbox.md, 'Where no cgroup can be made')",
                cgroup_available(),
            )
        self._semaphore: asyncio.Semaphore | None = None

    async def run(self, code: str, stdin: str = "") -> SandboxResult:
        """Execute `code` (Python source) in a fresh sandboxed process; never raises for the
        snippet's own failures (they are in the result)."""
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
        async with self._semaphore:
            return await self._run(code, stdin)

    async def _run(self, code: str, stdin: str) -> SandboxResult:
        c = self.config
        try:
            cgroup = SnippetCgroup(self.cgroups, c.memory_mb, c.max_processes + 3) if self.cgroups else None  # + S, C, P1
        except OSError as e:  # the probe made one: this is the machine's trouble (too many cgroups?), not the snippet's
            why = f"sandbox setup failed: making the snippet's cgroup in {self.cgroups[0].base}: {e.strerror}\n"
            return SandboxResult("", why, EXIT_SETUP_FAILED)
        workdir = None if self.isolated else tempfile.mkdtemp(prefix="hybridrl-sandbox-")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status = _Status(ours)
        start = time.perf_counter()
        try:
            argv, pass_fds = _spawn_plan(code, c, self.isolated, workdir, theirs.fileno(), cgroup.procs if cgroup else [])
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd="/",
                    env={"LANG": "C.UTF-8"},
                    pass_fds=pass_fds,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                )
            finally:
                os.close(pass_fds[0])
                theirs.close()
            out, err, truncated = bytearray(), bytearray(), [False]
            io = asyncio.gather(
                _feed(proc, stdin.encode()),
                _drain(proc.stdout, out, c.max_output_bytes, truncated),
                _drain(proc.stderr, err, c.max_output_bytes, truncated),
            )
            timed_out = False
            try:
                await asyncio.wait_for(status.read(until_started=True), _SETUP_TIMEOUT_S)
                if status.snippet:
                    # The wall limit is this clock's, from the snippet's start; C's own is a backstop for a trainer
                    # that is gone. Nothing the snippet does to the setup (SIGSTOP) can stretch it.
                    await asyncio.wait_for(status.read(), c.wall_timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
            finally:
                await _end(proc, status, cgroup, self.isolated)
                try:
                    await asyncio.wait_for(io, 2)  # every holder of the pipes is dead by now
                except asyncio.TimeoutError:
                    pass
            oom = cgroup.oom_kills() if cgroup else 0
            if oom:
                err += f"\nsandbox: over the memory limit ({c.memory_mb} MB for all its processes): {oom} killed\n".encode()
            timed_out = timed_out or status.timed_out
            return SandboxResult(
                out.decode("utf-8", "replace"),
                err.decode("utf-8", "replace"),
                None if timed_out else proc.returncode,
                timed_out,
                truncated[0],
                time.perf_counter() - start,
            )
        finally:
            status.close()
            if cgroup:
                await cgroup.remove()
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)


class _Status:
    """The setup's reports on a SOCK_SEQPACKET socket (a message each): `started <pid>` with a pidfd of P1, the
    moment C forks it; `timeout` when C's backstop clock fired; end of file once S and C have both exited."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.setblocking(False)
        self.snippet: tuple[int, int] | None = None  # (pid, pidfd) of the snippet's first process
        self.timed_out = False
        self.ended = False

    async def read(self, until_started: bool = False) -> None:
        """Take the reports until the setup has ended (or, with `until_started`, the snippet has started)."""
        while not self.ended and not (until_started and self.snippet):
            if not self.take_one():
                await _readable(self.sock.fileno(), None)

    def take_one(self) -> bool:
        """Take one report; False when none is waiting."""
        try:
            message, fds, _, _ = socket.recv_fds(self.sock, 64, 1)
        except BlockingIOError:
            return False
        if message.startswith(b"started ") and len(fds) == 1 and self.snippet is None:
            self.snippet = int(message.split()[1]), fds.pop()
        self.timed_out |= message == b"timeout"
        self.ended = not message
        for fd in fds:
            os.close(fd)
        return True

    def close(self) -> None:
        if self.snippet:
            os.close(self.snippet[1])
        self.sock.close()


async def _end(proc, status: _Status, cgroup: SnippetCgroup | None, isolated: bool) -> None:
    """SIGKILL everything of one run, whatever the snippet did to detach itself, and return once it is gone:
    its first process through the pidfd (in a PID namespace that takes every process of the namespace with
    it, and the pidfd turns readable only once they are all dead), its cgroup, and then the setup (S, C),
    which ends by itself once P1 has, unless it is stopped or stuck. In the fallback without a cgroup, the
    snippet's own session is signalled too (what left it is out of reach: docs/sandbox.md)."""
    killed = status.snippet is not None and await _kill_snippet(status.snippet, cgroup is None and not isolated)
    if cgroup:
        cgroup.kill()
    try:
        await asyncio.wait_for(status.read(), 0.5)
    except asyncio.TimeoutError:
        if proc.returncode is None:
            _killpg(proc.pid)  # S is not reaped yet, so its process group id is still its own
    if status.snippet and not killed:  # reported after the setup's deadline
        await _kill_snippet(status.snippet, cgroup is None and not isolated)
    try:  # S's exit status; proc.wait() also waits for the pipes, which a process that escaped may hold
        await asyncio.wait_for(proc.wait(), 1)
    except asyncio.TimeoutError:
        for _ in range(400):
            if proc.returncode is not None:
                break
            await asyncio.sleep(0.01)


async def _kill_snippet(snippet: tuple[int, int], its_session_too: bool) -> bool:
    pid, pidfd = snippet
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass  # already gone
    if its_session_too:
        _killpg(pid)  # P1 leads a session of its own
    await _readable(pidfd, 5)
    return True


async def _readable(fd: int, within_s: float) -> bool:
    loop = asyncio.get_running_loop()
    readable = loop.create_future()
    loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
    try:
        await asyncio.wait_for(readable, within_s)
        return True
    except asyncio.TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


async def _feed(proc, data: bytes) -> None:
    try:
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


async def _drain(stream, buf: bytearray, limit: int, truncated: list) -> None:
    """Read everything (so the child never blocks on a full pipe), keep the first `limit` bytes."""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        room = limit - len(buf)
        if room > 0:
            buf += chunk[:room]
        if len(chunk) > max(room, 0):
            truncated[0] = True


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
