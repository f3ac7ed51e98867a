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
from dataclasses import dataclass, field

EXIT_SETUP_FAILED = 121  # the sandbox could not be set up (the reason is the last line of stderr)
SANDBOX_UID = 65534  # nobody (overflowuid) inside the user namespace, and on the host when the trainer is root
# pivot_root(2) has no glibc wrapper: its syscall number per architecture.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}

# Runs inside the sandboxed interpreter (-I: no user site, no PYTHON* variables; installed packages import),
# as PID 1 of the sandbox: installs the audit hook (the second line), then runs snippet.py from the working
# directory. Everything lives in a function so the snippet finds no hook state in __main__.
_LAUNCHER = r"""# hybridrl-sandbox-launcher
def _launch(audit, max_forks):
    import os, sys
    cwd = os.path.realpath(os.getcwd())
    denied = {"ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.addressof",
              "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "ctypes.set_errno", "os.setuid",
              "os.setgid", "sys.addaudithook", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.forkpty",
              "subprocess.Popen", "pty.spawn", "os.mkfifo", "os.mknod", "socket.connect", "socket.bind",
              "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"}
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    forks = [max_forks]

    def inside(path):
        if isinstance(path, int):
            return False  # an fd: its file may be anywhere
        try:
            p = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return p == cwd or p.startswith(cwd + os.sep) or p == "/dev/null"

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            writing = writing or (isinstance(flags, int) and flags & write_flags)
            if writing and path is not None and not isinstance(path, int) and not inside(path):
                raise PermissionError("sandbox: writing outside the working directory is not allowed: %r" % (path,))
        elif event in ("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
                       "shutil.rmtree", "os.symlink", "os.link", "os.rename", "shutil.move", "shutil.copyfile",
                       "shutil.copytree"):
            # the first argument is a path or an fd (fchmod: its file may be anywhere); a second path is a destination
            targets = [args[0]] + [a for a in args[1:2] if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(a) for a in targets):
                raise PermissionError("sandbox: %s outside the working directory is not allowed" % event)
        elif event == "sqlite3.connect":
            if args[0] not in (":memory:", b":memory:", "") and not inside(args[0]):
                raise PermissionError("sandbox: sqlite3.connect outside the working directory is not allowed")
        elif event in denied:
            raise PermissionError("sandbox: %s is not allowed" % event)
        elif event == "os.fork":
            forks[0] -= 1
            if forks[0] < 0:
                raise PermissionError("sandbox: too many processes")
        elif event == "import" and args[0] in ("_posixsubprocess", "_ctypes"):
            # ctypes reads and writes raw memory with no audit event (memmove, memset, cast): refused whole, as an
            # ImportError, so that libraries that only try it (numpy) still import
            raise ImportError("sandbox: importing %s is not allowed" % args[0])

    if audit:
        sys.addaudithook(hook)
    sys.argv = ["snippet.py"]
    with open("snippet.py") as f:
        code = compile(f.read(), "snippet.py", "exec")
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit:
        raise
    except BaseException as e:  # the snippet's traceback without this launcher's frames
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)

_launch(AUDIT, MAX_FORKS)
"""

# The sandbox's first process S, started with vfork + exec (never a preexec_fn, so the trainer -- gigabytes
# resident, a CUDA context -- is never fork()ed). argv: launcher source, the plan as JSON. Inherited fds:
# the snippet (a memfd) and a status pipe. S applies the limits and forks C, which unshares new user, mount,
# PID, network, IPC and UTS namespaces and opens the allowlisted paths (still as the trainer's uid, so a
# Python under a private home is reachable). S, outside, writes C's uid/gid maps (65534 -> the host's nobody
# when S is root, else S's own uid). C takes that uid and forks P1, PID 1 of the new PID namespace, which
# builds the root (a tmpfs with read-only binds, a fresh /proc, the working tmpfs), pivots into it, drops
# everything, and execs the launcher. C waits for P1 with the wall-clock timeout; at the timeout it SIGKILLs
# P1, and waitpid returns only after the kernel has killed every process in the namespace. Exit status:
# P1's, or EXIT_SETUP_FAILED with a one-line reason on stderr.
_SETUP = r"""
import ctypes, json, os, resource, select, signal, sys
launcher, plan = sys.argv[1], json.loads(sys.argv[2])
code_fd, status_fd = plan["code_fd"], plan["status_fd"]
libc = ctypes.CDLL(None, use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21

def fail(what):
    os.write(2, ("sandbox setup failed: %s\n" % what).encode())
    os._exit(EXIT_SETUP_FAILED)

def check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        fail("%s: %s" % (what, os.strerror(e)))

def mount(src, dst, fstype, flags, data):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount %s on %s" % (src, dst))

root = "/tmp"  # any existing directory will do: the new root is mounted over it, in P1's mount namespace only

def read_only_bind(fd, dst):
    mount("/proc/self/fd/%d" % fd, dst, None, MS_BIND | MS_REC, None)
    # a bind keeps the source's locked flags (nosuid, noexec, atime): the remount must repeat them
    f = os.statvfs("/proc/self/fd/%d" % fd).f_flag
    keep = (MS_NOEXEC if f & 8 else 0) | (MS_NOATIME if f & 1024 else 0) | (MS_NODIRATIME if f & 2048 else 0)
    keep |= MS_RELATIME if f & 4096 else 0
    keep |= 0 if dst.startswith(root + "/dev/") else MS_NODEV
    mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep, None)

def enter_and_exec(binds):  # P1: build the root, pivot into it, drop everything, exec the launcher
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with C (C dying before this line took
    # P1's process group with it: P1 is still in it)
    if plan["isolate"]:
        mount(None, "/", None, MS_REC | MS_PRIVATE, None)
        mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for fd, dst in sorted(binds, key=lambda b: b[1]):
            target = root + dst
            if os.path.isdir("/proc/self/fd/%d" % fd):
                os.makedirs(target, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "a").close()
            read_only_bind(fd, target)
        for name, to in plan["symlinks"]:
            os.symlink(to, root + name)
        for d in ("proc", "sandbox"):
            os.mkdir(root + "/" + d, 0o755)
        mount("tmpfs", root + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, "size=%dk,mode=0700" % (plan["max_disk_mb"] * 1024))
        # a fresh /proc of the new PID namespace; a container that hides parts of its own /proc refuses
        # it, and then the sandbox has no /proc at all (never the host's)
        proc_flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
        if libc.mount(b"proc", (root + "/proc").encode(), b"proc", proc_flags, None) == 0:
            # no user namespaces below this one: a nested one would give the snippet capabilities again (over
            # its own copies of these mounts only, but a larger kernel surface)
            with open(root + "/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0")
        os.chdir(root)
        check(libc.syscall(plan["sys_pivot_root"], b".", b"."), "pivot_root")
        check(libc.umount2(b".", 2), "detach the host's root")  # MNT_DETACH
        os.chdir("/")
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
        os.chdir("/sandbox")
    else:
        os.setpgid(0, 0)  # the fallback has no PID namespace: its tree is this process group
        os.chdir(plan["workdir"])
    with open("snippet.py", "wb") as f:
        while True:
            chunk = os.read(code_fd, 1 << 16)
            if not chunk:
                break
            f.write(chunk)
    resource.setrlimit(resource.RLIMIT_NPROC, (plan["nproc"], plan["nproc"]))
    for cap in range(64):  # PR_CAPBSET_DROP; the others go at the exec (a non-root uid, no file capabilities)
        libc.prctl(24, cap, 0, 0, 0)
    check(libc.prctl(38, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    os.closerange(3, 1 << 16)
    os.execve(plan["python"], [plan["python"], "-I", "-c", launcher], plan["env"])

try:
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (plan["cpu_s"], plan["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (plan["memory_mb"] * mb, plan["memory_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (plan["max_file_mb"] * mb, plan["max_file_mb"] * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (plan["max_open_files"], plan["max_open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
except OSError as e:
    fail("%s: %s" % (type(e).__name__, e))
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
c = os.fork()
if c == 0:  # C
    os.close(ready_r), os.close(go_w)
    if plan["isolate"]:
        check(libc.unshare(plan["flags"]), "unshare(user, mount, pid, net, ipc, uts)")
    os.write(ready_w, b"u")
    if os.read(go_r, 1) != b"g":
        os._exit(EXIT_SETUP_FAILED)  # S has said why
    try:  # open the sources in the new mount namespace (a bind's source must be a mount of it), as the trainer's uid
        binds = [(os.open(src, os.O_PATH | os.O_CLOEXEC), dst) for src, dst in plan["binds"]]
    except OSError as e:
        fail("opening %s for the sandbox's root: %s" % (e.filename, e.strerror))
    if plan["isolate"] and plan["setuid"]:
        try:
            os.setgroups([])
            os.setresgid(plan["gid"], plan["gid"], plan["gid"])
            os.setresuid(plan["uid"], plan["uid"], plan["uid"])
        except OSError as e:
            fail("taking uid %d: %s" % (plan["uid"], e))
    p1 = os.fork()
    if p1 == 0:  # P1
        try:
            enter_and_exec(binds)
        except BaseException as e:  # never run the snippet half-isolated
            fail("%s: %s" % (type(e).__name__, e))
    # C: wait for P1, at most the wall-clock timeout
    for fd in (ready_w, go_r, code_fd):
        os.close(fd)
    pidfd = os.pidfd_open(p1)
    if not select.select([pidfd], [], [], plan["timeout_s"])[0]:
        os.write(status_fd, b"timeout")
        if plan["isolate"]:
            os.kill(p1, signal.SIGKILL)  # PID 1 of the namespace: the kernel kills the rest before P1 is reaped
        else:
            os.killpg(p1, signal.SIGKILL)
    _, status = os.waitpid(p1, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
# S: write C's maps from outside (only a process in the parent namespace may map a uid other than its own)
os.close(ready_w), os.close(go_r)
if os.read(ready_r, 1) != b"u":
    os.waitpid(c, 0)
    sys.exit(EXIT_SETUP_FAILED)  # C has said why
if plan["isolate"]:
    try:
        uid, gid = (plan["uid"], plan["gid"]) if plan["setuid"] else (os.geteuid(), os.getegid())
        if not plan["setuid"]:
            with open("/proc/%d/setgroups" % c, "w") as f:
                f.write("deny")
        for name, outside in (("uid_map", uid), ("gid_map", gid)):
            with open("/proc/%d/%s" % (c, name), "w") as f:
                f.write("%d %d 1\n" % (plan["uid" if name == "uid_map" else "gid"], outside))
    except OSError as e:
        os.kill(c, signal.SIGKILL)
        fail("writing the uid/gid maps: %s" % e)
os.write(go_w, b"g")
_, status = os.waitpid(c, 0)
sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
""".replace("EXIT_SETUP_FAILED", str(EXIT_SETUP_FAILED))


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
    max_disk_mb: int = 64  # all it may write (the size of its working tmpfs)
    max_processes: int = 16  # processes (and threads) the snippet may add, its whole tree counted
    max_open_files: int = 64
    max_concurrency: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    allow_unsafe_fallback: bool = False  # no namespaces: run anyway with the limits and the audit hook only

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
        "env": {
            "PATH": "/usr/bin:/bin",
            "HOME": workdir or "/sandbox",
            "TMPDIR": workdir or "/sandbox",
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        },
    }
    launcher = _LAUNCHER.replace("AUDIT, MAX_FORKS", f"{_AUDIT_HOOK!r}, {c.max_processes!r}")
    argv = [sys.executable, "-I", "-S", "-c", _SETUP, launcher, json.dumps(plan)]  # -S: the setup needs no site-packages
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
