"""The sandbox's setup program: builds the isolation, then execs the snippet's interpreter.

Not imported by the sandbox at run time: `local.py` passes this file's source to a fresh
`python -I -S -c` (no site-packages: it needs the standard library only, and must not import
hybridrl, which the sandbox's root does not hold). argv: the launcher's source (launcher.py), the
plan as JSON. Inherited fds: the snippet (a memfd) and a status socket to the trainer.

S (this process, the trainer's uid) joins the snippet's cgroup (when there is one), applies the
limits and forks C, which unshares new user, mount, PID, network, IPC and UTS namespaces and opens
the allowlisted paths (still as the trainer's uid, so a Python under a private home is reachable).
S, outside, writes C's uid/gid maps (65534 -> the host's nobody when S is root, else S's own uid). C
takes that uid and forks P1, PID 1 of the new PID namespace, and sends the trainer a pidfd of it.
P1 starts a session of its own, builds the root (a tmpfs with read-only binds, a fresh /proc, the
working tmpfs), pivots into it, drops everything, leaves the trainer's keyring behind, installs the
seccomp filter and execs the launcher. The trainer kills P1 at the wall limit (its clock); C waits
for P1 a little longer, as a backstop for a trainer that is gone, and waitpid returns only after the
kernel has killed every process in the namespace. Exit status: P1's, or EXIT_SETUP_FAILED with a
one-line reason on stderr.
"""

import ctypes
import errno
import json
import os
import resource
import select
import signal
import socket
import sys

EXIT_SETUP_FAILED = 121  # the sandbox could not be set up (the reason is the last line of stderr)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
ROOT = "/tmp"  # any existing directory will do: the new root is mounted over it, in P1's mount namespace only

libc = ctypes.CDLL(None, use_errno=True)


def fail(what):
    os.write(2, ("sandbox setup failed: %s\n" % what).encode())
    os._exit(EXIT_SETUP_FAILED)


def check(ret, what):
    if ret != 0:
        e = ctypes.get_errno()
        fail("%s: %s" % (what, os.strerror(e)))


def mount(src, dst, fstype, flags, data):
    def enc(s):
        return None if s is None else s.encode()

    check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount %s on %s" % (src, dst))


def read_only_bind(fd, dst):
    mount("/proc/self/fd/%d" % fd, dst, None, MS_BIND | MS_REC, None)
    # a bind keeps the source's locked flags (nosuid, noexec, atime): the remount must repeat them
    f = os.statvfs("/proc/self/fd/%d" % fd).f_flag
    keep = (MS_NOEXEC if f & 8 else 0) | (MS_NOATIME if f & 1024 else 0) | (MS_NODIRATIME if f & 2048 else 0)
    keep |= MS_RELATIME if f & 4096 else 0
    keep |= 0 if dst.startswith(ROOT + "/dev/") else MS_NODEV
    mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep, None)


def build_root(plan, binds):
    """P1, in its own mount namespace: a tmpfs root of read-only binds, a fresh /proc and the working
    tmpfs; pivot into it and detach the host's root."""
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    mount("tmpfs", ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for fd, dst in sorted(binds, key=lambda b: b[1]):
        target = ROOT + dst
        if os.path.isdir("/proc/self/fd/%d" % fd):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()
        read_only_bind(fd, target)
    for name, to in plan["symlinks"]:
        os.symlink(to, ROOT + name)
    for d in ("proc", "sandbox"):
        os.mkdir(ROOT + "/" + d, 0o755)
    mount("tmpfs", ROOT + "/sandbox", "tmpfs", MS_NOSUID | MS_NODEV, "size=%dk,mode=0700" % (plan["max_disk_mb"] * 1024))
    # a fresh /proc of the new PID namespace; a container that hides parts of its own /proc refuses
    # it, and then the sandbox has no /proc at all (never the host's)
    proc_flags = ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if libc.mount(b"proc", (ROOT + "/proc").encode(), b"proc", proc_flags, None) == 0:
        # no user namespaces below this one: a nested one would give the snippet capabilities again (over
        # its own copies of these mounts only, but a larger kernel surface)
        with open(ROOT + "/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    os.chdir(ROOT)
    check(libc.syscall(plan["sys_pivot_root"], b".", b"."), "pivot_root")
    check(libc.umount2(b".", 2), "detach the host's root")  # MNT_DETACH
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    os.chdir("/sandbox")


def enter_and_exec(plan, launcher, binds):
    """P1: build the root, pivot into it, drop everything, exec the launcher."""
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with C (the snippet may clear it: the trainer
    # holds a pidfd of P1 and the cgroup, and kills both when run() returns)
    os.setsid()  # a session of its own: the snippet's signals to its process group never reach S or C
    if plan["isolate"]:
        build_root(plan, binds)
    else:
        os.chdir(plan["workdir"])
    with open("snippet.py", "wb") as f:
        while True:
            chunk = os.read(plan["code_fd"], 1 << 16)
            if not chunk:
                break
            f.write(chunk)
    resource.setrlimit(resource.RLIMIT_NPROC, (plan["nproc"], plan["nproc"]))
    for cap in range(64):  # PR_CAPBSET_DROP; the others go at the exec (a non-root uid, no file capabilities)
        libc.prctl(24, cap, 0, 0, 0)
    check(libc.prctl(38, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    leave_the_keyrings(plan)
    os.closerange(3, 1 << 16)
    os.execve(plan["python"], [plan["python"], "-I", "-c", launcher, *plan["launcher_args"]], plan["env"])


def leave_the_keyrings(plan):
    """A fresh anonymous session keyring instead of the trainer's (inherited, and possessing a keyring grants
    every right on it), then the seccomp filter that refuses the key syscalls (seccomp.py)."""
    if plan["sys_keyctl"] is not None and libc.syscall(plan["sys_keyctl"], 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING
        if ctypes.get_errno() != errno.ENOSYS:  # a kernel without keys has no keyring to leave
            check(-1, "joining a fresh session keyring")
    if plan["seccomp"]:
        program = bytes.fromhex(plan["seccomp"])
        filters = ctypes.create_string_buffer(program, len(program))

        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

        fprog = SockFprog(len(program) // 8, ctypes.addressof(filters))
        check(libc.prctl(22, 2, ctypes.byref(fprog), 0, 0), "installing the seccomp filter")  # PR_SET_SECCOMP, FILTER


def apply_limits(plan):
    mb = 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (plan["cpu_s"], plan["cpu_s"] + 1))
        resource.setrlimit(resource.RLIMIT_AS, (plan["memory_mb"] * mb, plan["memory_mb"] * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (plan["max_file_mb"] * mb, plan["max_file_mb"] * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (plan["max_open_files"], plan["max_open_files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except OSError as e:
        fail("%s: %s" % (type(e).__name__, e))


def run_c(plan, launcher, ready_w, go_r):
    """C: unshare, wait for S to write the maps, take the sandbox uid, fork P1 and wait for it."""
    if plan["isolate"]:
        check(libc.unshare(plan["flags"]), "unshare(user, mount, pid, net, ipc, uts)")
    os.write(ready_w, b"u")
    if os.read(go_r, 1) != b"g":
        os._exit(EXIT_SETUP_FAILED)  # S has said why
    try:  # open the sources in the new mount namespace (a bind's source must be a mount of it), as the trainer's uid
        binds = [(os.open(src, os.O_PATH | os.O_CLOEXEC), dst) for src, dst in plan["binds"]]
    except OSError as e:
        fail("opening %s for the sandbox's root: %s" % (e.filename, e.strerror))
    # Over memory.max (or out of the host's memory) the snippet's processes go first, never S or the trainer.
    # Written before taking the sandbox uid (then /proc/self belongs to root) and inherited by P1. A preference,
    # not a limit: where /proc refuses it, the run goes on.
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
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
            enter_and_exec(plan, launcher, binds)
        except BaseException as e:  # never run the snippet half-isolated
            fail("%s: %s" % (type(e).__name__, e))
    # C: hand the trainer a pidfd of P1 (a handle no pid reuse can redirect), then wait for P1: the trainer
    # kills it at the wall limit; this clock, a little later, holds when the trainer is gone
    for fd in (ready_w, go_r, plan["code_fd"]):
        os.close(fd)
    pidfd = os.pidfd_open(p1)
    status = socket.socket(fileno=plan["status_fd"])
    socket.send_fds(status, [b"started %d" % p1], [pidfd])
    if not select.select([pidfd], [], [], plan["timeout_s"])[0]:
        status.send(b"timeout")
        if plan["isolate"]:
            os.kill(p1, signal.SIGKILL)  # PID 1 of the namespace: the kernel kills the rest before P1 is reaped
        else:
            os.killpg(p1, signal.SIGKILL)
    _, status = os.waitpid(p1, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def write_maps(plan, c):
    """S: write C's maps from outside (only a process in the parent namespace may map a uid other than its own)."""
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


def join_cgroup(plan):
    """S joins the snippet's cgroup before it forks: every process of the snippet is born inside (cgroup.py)."""
    for procs in plan["cgroup_procs"]:
        try:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            fail("joining the snippet's cgroup %s: %s" % (os.path.dirname(procs), e.strerror))


def main():
    launcher, plan = sys.argv[1], json.loads(sys.argv[2])
    join_cgroup(plan)
    apply_limits(plan)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    c = os.fork()
    if c == 0:
        os.close(ready_r), os.close(go_w)
        run_c(plan, launcher, ready_w, go_r)
    os.close(ready_w), os.close(go_r)
    if os.read(ready_r, 1) != b"u":
        os.waitpid(c, 0)
        sys.exit(EXIT_SETUP_FAILED)  # C has said why
    if plan["isolate"]:
        write_maps(plan, c)
    os.write(go_w, b"g")
    _, status = os.waitpid(c, 0)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
