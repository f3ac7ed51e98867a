"""Running untrusted Python (the model's code) without letting it escape or stall the run.

`LocalSandbox.run(code)` executes one snippet in a fresh process and returns what it printed.
What contains it, and how (docs/sandbox.md has the table):

- **its own process tree, killed whole**: the snippet runs as PID 1 of a new PID namespace, so
  when it ends or is killed every process it started dies with it (a fork bomb's children
  included), and the wall-clock timeout kills the tree;
- **no network**: a new network namespace (only a loopback that is down). Where the kernel does
  not allow namespaces the sandbox refuses to start, unless `allow_unsafe_fallback` is set
  (then sockets are blocked by an audit hook only: best effort);
- **resource limits** (setrlimit): CPU seconds, address space, file size, open files, and
  processes (RLIMIT_NPROC over the user's current count; root is exempt from it, so the audit
  hook below also counts forks);
- **a fresh temporary working directory**, deleted afterwards; an audit hook installed before the
  snippet runs refuses writes outside it, process spawning (`subprocess`, `os.system`, `exec*`),
  forks beyond `max_processes`, and the ways around the hook (calling C functions through
  `ctypes`, `_posixsubprocess`, setuid). The hook is Python-level: the kernel-enforced parts are the namespaces and limits;
- **an empty environment**: the parent's variables (tokens, keys) are not passed;
- **bounded output**: stdout and stderr are read as they come and cut at `max_output_bytes`;
- **bounded concurrency**: at most `max_concurrency` snippets run at once (an asyncio
  semaphore); `run` never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
EXIT_SETUP_FAILED = 121  # the launcher could not set the sandbox up (see stderr)

# Runs inside the sandboxed interpreter (-I: no user site, no PYTHON* variables; installed packages import):
# installs the audit hook, then runs the snippet from the working directory.
_LAUNCHER = r"""
import os, sys
_cwd = os.path.realpath(os.getcwd())
_ALLOW_NET = {allow_net!r}
_forks = [{max_forks!r}]
_DENIED = {{"ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.addressof", "os.setuid", "os.setgid",
           "sys.addaudithook", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.forkpty", "subprocess.Popen",
           "pty.spawn"}}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC

def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path) if not isinstance(path, int) else "/proc/self/fd/%d" % path)
    except Exception:
        return False
    return p == _cwd or p.startswith(_cwd + os.sep) or p == "/dev/null"

def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _WRITE_FLAGS)
        if writing and path is not None and not isinstance(path, int) and not _inside(path):
            raise PermissionError("sandbox: writing outside the working directory is not allowed: %r" % (path,))
    elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                   "shutil.rmtree", "os.symlink", "os.link"):
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError("sandbox: %s outside the working directory is not allowed" % event)
    elif event in ("os.rename", "shutil.move", "shutil.copyfile", "shutil.copytree"):
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError("sandbox: %s outside the working directory is not allowed" % event)
    elif event in _DENIED:
        raise PermissionError("sandbox: %s is not allowed" % event)
    elif event == "os.fork":
        _forks[0] -= 1
        if _forks[0] < 0:
            raise PermissionError("sandbox: too many processes")
    elif event == "import" and args[0] == "_posixsubprocess":
        raise PermissionError("sandbox: importing %s is not allowed" % args[0])
    elif not _ALLOW_NET and event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
        raise PermissionError("sandbox: network access is not allowed")

sys.addaudithook(_hook)
del _hook
sys.argv = ["snippet.py"]
with open("snippet.py") as f:
    _code = compile(f.read(), "snippet.py", "exec")
try:
    exec(_code, {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit:
    raise
except BaseException as _e:  # the snippet's traceback without this launcher's frame
    import traceback
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.exit(1)
"""


class SandboxUnavailable(RuntimeError):
    """The kernel does not allow the isolation the sandbox needs (and no fallback is allowed)."""


@dataclass
class SandboxConfig:
    """Limits of one execution (the python tool's `config:` keys of the same names)."""

    wall_timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 1024  # address space (RLIMIT_AS)
    max_output_bytes: int = 8192  # of stdout and of stderr each
    max_file_mb: int = 16  # largest file it may write (RLIMIT_FSIZE)
    max_processes: int = 16  # processes one snippet may add (RLIMIT_NPROC over its user's current count)
    max_open_files: int = 64
    max_concurrency: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    allow_unsafe_fallback: bool = False  # no namespaces: run anyway with the audit hook only

    @classmethod
    def from_dict(cls, config: dict) -> "SandboxConfig":
        known = {f: config[f] for f in cls.__dataclass_fields__ if f in config}
        return cls(**known)


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed at the timeout
    timed_out: bool = False
    truncated: bool = False  # output cut at max_output_bytes
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _processes_of(uid: int) -> int:
    """How many processes `uid` runs now (RLIMIT_NPROC counts them all, not one snippet's)."""
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n


def namespaces_available() -> str | None:
    """None when a child can get new user, PID and network namespaces here, else why not."""
    import subprocess

    argv = _setup_argv("pass", SandboxConfig(max_concurrency=1), _processes_of(os.geteuid()) + 4, True)
    try:
        r = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    except (OSError, subprocess.SubprocessError) as e:
        return f"{type(e).__name__}: {e}"
    if r.returncode != 0:
        why = r.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET) failed ({why[-1] if why else f'exit {r.returncode}'})"
    return None


_NAMESPACES: dict[str, str | None] = {}


class LocalSandbox:
    def __init__(self, config: SandboxConfig | None = None):
        self.config = config or SandboxConfig()
        if "probe" not in _NAMESPACES:
            _NAMESPACES["probe"] = namespaces_available()
        self.isolated = _NAMESPACES["probe"] is None
        if not self.isolated and not self.config.allow_unsafe_fallback:
            raise SandboxUnavailable(
                f"the code sandbox needs Linux user, PID and network namespaces, and this machine refuses them "
                f"({_NAMESPACES['probe']}). Allow them (e.g. sysctl kernel.unprivileged_userns_clone=1, or run where "
                f"containers permit unshare), use a SandboxFusion service (the python tool's sandbox_fusion_url), "
                f"or set the python tool's config allow_unsafe_fallback: true to run with resource limits and an "
                f"audit hook only (no kernel network isolation)"
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
        workdir = tempfile.mkdtemp(prefix="hybridrl-sandbox-")
        start = time.perf_counter()
        try:
            with open(os.path.join(workdir, "snippet.py"), "w") as f:
                f.write(code)
            launcher = _LAUNCHER.format(allow_net=False, max_forks=c.max_processes)
            nproc = _processes_of(os.geteuid()) + c.max_processes
            proc = await asyncio.create_subprocess_exec(
                *_setup_argv(launcher, c, nproc, self.isolated),
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1"},
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            out, err, truncated = bytearray(), bytearray(), [False]
            timed_out = False
            try:
                await asyncio.wait_for(
                    asyncio.gather(
                        _feed(proc, stdin.encode()),
                        _drain(proc.stdout, out, c.max_output_bytes, truncated),
                        _drain(proc.stderr, err, c.max_output_bytes, truncated),
                        proc.wait(),
                    ),
                    c.wall_timeout_s,
                )
            except asyncio.TimeoutError:
                timed_out = True
            finally:
                _kill_tree(proc.pid)
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except asyncio.TimeoutError:
                    pass
            code_ = None if timed_out else proc.returncode
            return SandboxResult(
                out.decode("utf-8", "replace"),
                err.decode("utf-8", "replace"),
                code_,
                timed_out,
                truncated[0],
                time.perf_counter() - start,
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


# The sandbox's first process (started without a preexec_fn, so the trainer -- gigabytes resident,
# a CUDA context -- is never fork()ed: vfork + exec costs the same at any parent size). It applies
# the limits to itself, enters new user, PID and network namespaces, then forks PID 1 of the new PID
# namespace, which execs the launcher; it passes PID 1's exit status on. When PID 1 exits, the
# kernel kills everything left in the namespace. argv: launcher source, limits as JSON.
_SETUP = r"""
import json, os, resource, sys
_launcher, _p = sys.argv[1], json.loads(sys.argv[2])
try:
    _mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (_p["cpu_s"], _p["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (_p["memory_mb"] * _mb, _p["memory_mb"] * _mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (_p["max_file_mb"] * _mb, _p["max_file_mb"] * _mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (_p["max_open_files"], _p["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (_p["nproc"], _p["nproc"]))  # root is exempt: the audit hook counts forks
    if _p["isolate"]:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
        if _libc.unshare(_p["flags"]) != 0:
            raise OSError(ctypes.get_errno(), "unshare failed")
except BaseException as e:  # report and exit: never run the snippet half-isolated
    os.write(2, ("sandbox setup failed: %s: %s\n" % (type(e).__name__, e)).encode())
    os._exit(EXIT_SETUP_FAILED)
_argv = [sys.executable, "-I", "-c", _launcher]
if not _p["isolate"]:
    os.execv(sys.executable, _argv)
_pid = os.fork()
if _pid == 0:
    os.execv(sys.executable, _argv)
_, _status = os.waitpid(_pid, 0)
sys.exit(os.waitstatus_to_exitcode(_status) if os.WIFEXITED(_status) else 128 + os.WTERMSIG(_status))
""".replace("EXIT_SETUP_FAILED", str(EXIT_SETUP_FAILED))

NAMESPACE_FLAGS = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET


def _setup_argv(launcher: str, c: SandboxConfig, nproc: int, isolate: bool) -> list[str]:
    import json

    limits = {
        "cpu_s": c.cpu_s,
        "memory_mb": c.memory_mb,
        "max_file_mb": c.max_file_mb,
        "max_open_files": c.max_open_files,
        "nproc": nproc,
        "isolate": isolate,
        "flags": NAMESPACE_FLAGS,
    }
    return [sys.executable, "-I", "-c", _SETUP, launcher, json.dumps(limits)]


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


def _kill_tree(pid: int) -> None:
    """SIGKILL the snippet's process group (its PID-namespace init with it: the namespace dies)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class SandboxFusionClient:
    """Runs code on a SandboxFusion-compatible service (verl's `sandbox_fusion.url`): POST
    {"code", "language": "python", "run_timeout", "memory_limit_MB"} to `url` (its /run_code
    endpoint) and read `run_result.{stdout, stderr, return_code, status}`. The service does the
    isolation; this client bounds time (per request, with retries on connection errors), the
    response size, and the output it keeps. Standard library only (urllib in a thread)."""

    def __init__(self, url: str, config: SandboxConfig | None = None, retries: int = 2, max_response_bytes: int = 1 << 20):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"sandbox_fusion_url must be an http:// or https:// URL (its /run_code endpoint), got {url!r}")
        self.url, self.config, self.retries, self.max_response_bytes = url, config or SandboxConfig(), retries, max_response_bytes
        self._semaphore: asyncio.Semaphore | None = None

    async def run(self, code: str, stdin: str = "") -> SandboxResult:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
        async with self._semaphore:
            start = time.perf_counter()
            body = await asyncio.to_thread(self._post, code, stdin)
            return self._result(body, time.perf_counter() - start)

    def _post(self, code: str, stdin: str) -> dict:
        import json
        import urllib.error
        import urllib.request

        c = self.config
        payload = {"code": code, "language": "python", "run_timeout": c.wall_timeout_s, "memory_limit_MB": c.memory_mb}
        if stdin:
            payload["stdin"] = stdin
        request = urllib.request.Request(
            self.url, json.dumps(payload).encode(), {"Content-Type": "application/json"}, method="POST"
        )
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=c.wall_timeout_s + 10) as response:
                    raw = response.read(self.max_response_bytes + 1)
                if len(raw) > self.max_response_bytes:
                    return {"_error": f"the sandbox service's response is over {self.max_response_bytes} bytes"}
                return json.loads(raw)
            except urllib.error.HTTPError as e:
                return {"_error": f"the sandbox service at {self.url} answered HTTP {e.code}"}
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = e
                time.sleep(0.2 * (attempt + 1))
            except json.JSONDecodeError:
                return {"_error": f"the sandbox service at {self.url} did not answer JSON"}
        return {"_error": f"the sandbox service at {self.url} is unreachable ({type(last).__name__}: {last})"}

    def _result(self, body: dict, seconds: float) -> SandboxResult:
        limit = self.config.max_output_bytes
        if "_error" in body:
            return SandboxResult("", body["_error"], None, duration_s=seconds)
        run = body.get("run_result") or {}
        compile_ = body.get("compile_result") or {}
        out, err = str(run.get("stdout") or ""), str(run.get("stderr") or compile_.get("stderr") or "")
        truncated = len(out.encode()) > limit or len(err.encode()) > limit
        timed_out = run.get("status") == "TimeLimitExceeded"
        code = run.get("return_code")
        if code is None and body.get("status") not in ("Success", None):
            err = err or f"sandbox service status {body.get('status')}: {body.get('message', '')}"
            code = 1
        return SandboxResult(
            out.encode()[:limit].decode("utf-8", "ignore"),
            err.encode()[:limit].decode("utf-8", "ignore"),
            None if timed_out else code,
            timed_out,
            truncated,
            seconds,
        )
