# hybridrl-sandbox-launcher
"""The first code of the snippet's interpreter, run as PID 1 of the sandbox.

Not imported: setup_child.py execs `python -I -c <this file's source> AUDIT MAX_FORKS` inside the
sandbox's root, which does not hold hybridrl (-I: no user site, no PYTHON* variables; installed
packages import). It installs the audit hook (the second line, not the boundary) when AUDIT is
"True", then runs snippet.py from the working directory. Everything lives in a function so the
snippet finds no hook state in __main__.
"""


def _launch(audit, max_forks):
    import os
    import sys

    cwd = os.path.realpath(os.getcwd())
    denied = {"ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.addressof",
              "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "ctypes.set_errno", "os.setuid",
              "os.setgid", "sys.addaudithook", "os.system", "os.exec", "os.spawn", "os.posix_spawn", "os.forkpty",
              "subprocess.Popen", "pty.spawn", "os.mkfifo", "os.mknod", "socket.connect", "socket.bind",
              "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"}  # fmt: skip
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
                       "shutil.copytree"):  # fmt: skip
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


if __name__ == "__main__":
    import sys

    _launch(sys.argv[1] == "True", int(sys.argv[2]))
