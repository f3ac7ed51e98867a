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
- **one process tree, counted and killed whole**: it is PID 1 of its PID namespace; RLIMIT_NPROC,
  counted per user namespace since Linux 5.14, bounds the whole tree at `max_processes`; at the
  wall-clock timeout PID 1 is killed and the kernel kills the rest before `run` returns;
- **resource limits**: CPU seconds, address space, file size, open files (setrlimit), and disk
  (`max_disk_mb`, the tmpfs size);
- **an empty environment** and **bounded output** (stdout and stderr cut at `max_output_bytes`);
- **bounded concurrency**: at most `max_concurrency` snippets at once; `run` never blocks the
  event loop.

A second line, not a boundary: an audit hook in the snippet's interpreter refuses process
spawning, ctypes calls, sockets and writes outside the working directory, so a model's mistake
fails with a readable message. Where the kernel refuses the namespaces, the sandbox refuses to
start, unless `allow_unsafe_fallback` is set (then only the limits and the hook hold).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from . import launcher, setup_child
from .config import SandboxConfig, SandboxResult, SandboxUnavailable

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


def _spawn_plan(code: str, c: SandboxConfig, isolate: bool, workdir: str | None):
    """(argv, fds to pass, the status pipe's read end, fds to close after the spawn)."""
    code_fd = os.memfd_create("hybridrl-snippet")
    data = code.encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(code_fd, data) :]
    os.lseek(code_fd, 0, os.SEEK_SET)
    status_r, status_w = os.pipe()
    binds, symlinks = _root_plan() if isolate else ([], [])
    nproc = c.max_processes + 2 if isolate else _processes_of(os.geteuid()) + c.max_processes + 3
    plan = {
        "code_fd": code_fd,
        "status_fd": status_w,
        "isolate": isolate,
        "flags": NAMESPACE_FLAGS,
        "setuid": os.geteuid() == 0,  # root maps the snippet to the host's nobody; anyone else to itself
        "uid": SANDBOX_UID,
        "gid": SANDBOX_UID,
        "binds": binds,
        "symlinks": symlinks,
        "sys_pivot_root": _SYS_PIVOT_ROOT.get(platform.machine(), -1),
        "cpu_s": c.cpu_s,
        "memory_mb": c.memory_mb,
        "max_file_mb": c.max_file_mb,
        "max_disk_mb": c.max_disk_mb,
        "max_open_files": c.max_open_files,
        "nproc": nproc,
        "timeout_s": c.wall_timeout_s,
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
    return argv, (code_fd, status_w), status_r, (code_fd, status_w)


def namespaces_available() -> str | None:
    """None when a snippet can run fully isolated here, else why not."""
    import subprocess

    if sys.platform != "linux":
        return f"it runs on Linux only, not {sys.platform}"
    if platform.machine() not in _SYS_PIVOT_ROOT:
        return f"pivot_root's syscall number is not known for {platform.machine()}"
    argv, pass_fds, status_r, close = _spawn_plan("pass", SandboxConfig(max_concurrency=1), True, None)
    try:
        r = subprocess.run(argv, capture_output=True, timeout=30, pass_fds=pass_fds, cwd="/", env={"LANG": "C.UTF-8"})
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        for fd in (*close, status_r):
            os.close(fd)
    if r.returncode != 0:
        why = r.stderr.decode("utf-8", "replace").strip().splitlines()
        return why[-1] if why else f"the probe exited with {r.returncode}"
    return None


_NAMESPACES: dict[str, str | None] = {}


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
        workdir = None if self.isolated else tempfile.mkdtemp(prefix="hybridrl-sandbox-")
        start = time.perf_counter()
        argv, pass_fds, status_r, close = _spawn_plan(code, c, self.isolated, workdir)
        try:
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
                for fd in close:
                    os.close(fd)
            out, err, truncated = bytearray(), bytearray(), [False]
            killed = False
            try:  # the sandbox kills at the timeout itself; this is a second, later deadline for a stuck setup
                await asyncio.wait_for(
                    asyncio.gather(
                        _feed(proc, stdin.encode()),
                        _drain(proc.stdout, out, c.max_output_bytes, truncated),
                        _drain(proc.stderr, err, c.max_output_bytes, truncated),
                        proc.wait(),
                    ),
                    c.wall_timeout_s + 10,
                )
            except asyncio.TimeoutError:
                killed = True
            finally:
                _kill_group(proc.pid)
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except asyncio.TimeoutError:
                    pass
            os.set_blocking(status_r, False)
            try:
                timed_out = killed or os.read(status_r, 64) == b"timeout"
            except BlockingIOError:
                timed_out = killed
            return SandboxResult(
                out.decode("utf-8", "replace"),
                err.decode("utf-8", "replace"),
                None if timed_out else proc.returncode,
                timed_out,
                truncated[0],
                time.perf_counter() - start,
            )
        finally:
            os.close(status_r)
            if workdir:
                shutil.rmtree(workdir, ignore_errors=True)


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


def _kill_group(pid: int) -> None:
    """SIGKILL the sandbox's setup processes (PID 1 of the snippet dies with them: PR_SET_PDEATHSIG)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
