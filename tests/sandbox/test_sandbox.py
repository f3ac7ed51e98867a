"""The code sandbox against hostile snippets: each must be contained, reported, and leave the
machine as it was. The escapes of issue 44 run twice: with the audit hook (as shipped) and with it
switched off, to show that the kernel holds alone. And the SandboxFusion client against a real
local HTTP server.

Where the kernel refuses the namespaces these tests FAIL (a CI machine must isolate); set
HYBRIDRL_ALLOW_NO_SANDBOX=1 on a machine known not to, and they skip."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
import sysconfig
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from sandbox_helpers import FORK_TREE, attempts, outcome, sandbox_processes

from hybridrl.sandbox import (
    EXIT_SETUP_FAILED,
    SANDBOX_UID,
    LocalSandbox,
    SandboxConfig,
    SandboxFusionClient,
    SandboxUnavailable,
)
from hybridrl.sandbox import local as sandbox_module


def test_prints_and_exit_codes(run):
    r = run("print(6 * 7)")
    assert (r.stdout, r.exit_code, r.timed_out, r.ok) == ("42\n", 0, False, True)
    r = run("import sys; print('bad', file=sys.stderr); sys.exit(3)")
    assert r.exit_code == 3 and "bad" in r.stderr and not r.ok
    r = run("x = 1\nprint(y)")  # the model sees its own traceback, not the launcher's frames
    assert r.exit_code == 1 and 'File "snippet.py", line 2' in r.stderr and "NameError" in r.stderr
    assert "<string>" not in r.stderr and r.stderr.count("File ") == 1


def test_infinite_loop_is_killed_at_the_wall_timeout(run):
    r = run("print('started', flush=True)\nwhile True: pass", wall_timeout_s=1.0)
    assert r.timed_out and r.exit_code is None and r.stdout == "started\n"
    assert sandbox_processes() == 0  # killed whole before run() returned


def test_children_die_with_the_snippet_even_in_their_own_session(run):
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # a new session and a double fork: still in the snippet's PID namespace
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('parent done')"
    )
    r = run(code)
    assert r.stdout == "parent done\n" and r.exit_code == 0
    assert sandbox_processes() == 0


def test_fork_bomb_is_contained(run):
    r = run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", wall_timeout_s=2.0)
    assert r.timed_out
    assert sandbox_processes() == 0


def test_the_process_limit_counts_the_whole_tree(run, hook):
    """Issue 44: a 10x10 fork tree made 74 processes under max_processes=16 (a per-process count)."""
    r = run(FORK_TREE, max_processes=16)
    assert r.exit_code == 0, r
    assert int(r.stdout) == 16
    assert sandbox_processes() == 0


def test_huge_allocation_fails_inside(run):
    r = run("x = bytearray(10**11)", memory_mb=512)
    assert r.exit_code == 1 and "MemoryError" in r.stderr


def test_writes_outside_the_working_dir_fail(run, hook, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    r = run(f"open({str(target)!r}, 'w').write('gone')")
    assert r.exit_code == 1
    r = run(f"import os; os.remove({str(target)!r})")
    assert r.exit_code == 1
    assert target.read_text() == "keep"
    r = run("open('mine.txt', 'w').write('ok'); print(open('mine.txt').read())")  # its own directory is fine
    assert r.stdout == "ok\n"


def test_the_guard_switching_itself_off_changes_nothing(run, hook, tmp_path):
    """Issue 44: one line cleared the hook's deny list; then os.system ran, a root-owned file was
    overwritten and a .pth planted in the venv's site-packages, executed by the next python start."""
    marker = tmp_path / "pwned"
    owned = tmp_path / "root-owned"
    owned.mkdir()
    precious = owned / "precious.txt"
    precious.write_text("keep")
    if os.geteuid() == 0:
        os.chown(owned, 0, 0), os.chown(precious, 0, 0)
    os.chmod(precious, 0o644)
    pth = os.path.join(sysconfig.get_paths()["purelib"], f"_hybridrl_sandbox_probe_{os.getpid()}.pth")
    code = attempts(
        "guard: g = sys.modules['__main__'].__dict__; g['_DENIED'].clear(); g['_inside'] = lambda p: True",
        f"system: os.system('echo pwned > {marker}')",
        f"overwrite: open({str(precious)!r}, 'w').write('pwned')",
        f"pth: open({pth!r}, 'w').write('# sandbox probe')",
    )
    try:
        r = outcome(run(code))
        assert not marker.exists()
        assert precious.read_text() == "keep"
        assert not os.path.exists(pth)
        assert r["overwrite"] != "done" and r["pth"] != "done"
    finally:
        if os.path.exists(pth):
            os.remove(pth)


def test_no_writes_outside_through_fifos_sqlite_or_fchmod(run, hook, tmp_path):
    """Issue 44: os.mkfifo, sqlite3.connect and os.fchmod of a file opened read-only wrote outside
    with no bypass needed."""
    fifo, db, target = tmp_path / "fifo", tmp_path / "db.sqlite", tmp_path / "target.txt"
    target.write_text("keep")
    os.chmod(target, 0o600)
    code = attempts(
        f"mkfifo: os.mkfifo({str(fifo)!r})",
        f"sqlite: import sqlite3; sqlite3.connect({str(db)!r}).execute('create table t (x)')",
        f"fchmod: fd = os.open({str(target)!r}, os.O_RDONLY); os.fchmod(fd, 0o777)",
    )
    r = outcome(run(code))
    assert not fifo.exists() and not db.exists()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert set(r.values()) & {"done"} == set(), r


def test_ctypes_raw_memory_is_refused(run):
    """Issue 44: ctypes.memmove and string_at read and wrote raw memory (a way to unhook the hook;
    the kernel-only runs above show what it would gain)."""
    r = outcome(
        run(
            attempts(
                "string_at: import ctypes; ctypes.string_at(id(1), 8)",
                "memmove: import ctypes; b = ctypes.create_string_buffer(8); ctypes.memmove(b, id(1), 8)",
            )
        )
    )
    assert r == {"string_at": "ImportError", "memmove": "ImportError"}
    r = run("import numpy; print(numpy.arange(4).sum())")  # numpy only tries ctypes
    assert r.stdout == "6\n", r


def test_host_files_and_the_hosts_root_are_not_visible(run, hook, tmp_path):
    """Issue 44: the sandbox read /etc/passwd, the trainer's model and checkpoint files, and the
    host's / through /proc/self/root."""
    ckpt = tmp_path / "runs" / "exp" / "checkpoints" / "global_step_3"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(b"weights")
    model = str(ckpt / "model.safetensors")
    code = attempts(
        "passwd: open('/etc/passwd').read()",
        f"checkpoint: open({model!r}, 'rb').read()",
        f"run_dir: os.listdir({str(tmp_path / 'runs')!r})",
        f"proc_root: open('/proc/self/root' + {model!r}, 'rb').read()",
        f"pid1_root: open('/proc/1/root' + {model!r}, 'rb').read()",
        "host_pids: assert len([p for p in os.listdir('/proc') if p.isdigit()]) > 2",
    )
    r = outcome(run(code))
    assert r == {
        "passwd": "FileNotFoundError",
        "checkpoint": "FileNotFoundError",
        "run_dir": "FileNotFoundError",
        "proc_root": "FileNotFoundError",
        "pid1_root": "FileNotFoundError",
        "host_pids": "AssertionError",  # its /proc is its own PID namespace's (or none)
    }, r


def test_disk_and_file_size_quotas(run, hook):
    """Issue 44: no disk quota. The working tmpfs holds max_disk_mb; one file at most max_file_mb."""
    code = (
        "import errno, os\n"
        "def write(name, mb):\n"
        "    try:\n"
        "        with open(name, 'wb') as f:\n"
        "            f.write(b'x' * (mb << 20))\n"
        "        return 'ok'\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        "big = write('big', 3)\n"
        "os.remove('big')\n"
        "print(big, *[write(f'f{i}', 2) for i in range(3)])\n"
    )
    r = run(code, max_disk_mb=5, max_file_mb=2)
    assert r.stdout.split() == ["EFBIG", "ok", "ok", "ENOSPC"], r


def test_runs_as_nobody_without_capabilities(run, hook):
    """Issue 44: the snippet ran as the host's root. Now uid 65534 of its user namespace, the host's
    nobody (when the trainer is root), no capabilities, no_new_privs, no nested user namespace."""
    code = (
        "import json, os\n"
        "r = {'ids': [os.getuid(), os.getgid()], 'root': sorted(os.listdir('/'))}\n"
        "if os.path.exists('/proc/self'):  # a container may refuse the sandbox a /proc of its own: then none\n"
        "    status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "    r['map'] = open('/proc/self/uid_map').read().split()\n"
        "    r['caps'] = [status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs')]\n"
        "try:\n"
        "    import ctypes\n"
        "    r['nested_userns'] = ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0\n"
        "except ImportError:\n"
        "    r['nested_userns'] = 'ImportError'\n"
        "print(json.dumps(r))\n"
    )
    r = outcome(run(code))
    assert r["ids"] == [SANDBOX_UID, SANDBOX_UID]
    python_dirs = {os.path.abspath(p).split(os.sep)[1] for p in (sys.prefix, os.path.realpath(sys.base_prefix))}
    system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sandbox"}
    assert "sandbox" in r["root"] and set(r["root"]) <= system | python_dirs, r["root"]
    if "map" in r:
        outside = SANDBOX_UID if os.geteuid() == 0 else os.geteuid()  # the host's nobody when the trainer is root
        assert r["map"] == [str(SANDBOX_UID), str(outside), "1"]
        assert r["caps"] == ["0000000000000000", "0000000000000000", "0000000000000000", "1"]
        assert r["nested_userns"] == ("ImportError" if hook else False)


def test_without_the_hook_it_cannot_remount_unmount_or_become_root(run, monkeypatch):
    """ctypes is the hook's to refuse; without the hook, the kernel still refuses what would undo the sandbox."""
    monkeypatch.setattr(sandbox_module, "_AUDIT_HOOK", False)
    code = (
        "import ctypes, errno, os, signal\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def err(ret):\n"
        "    return errno.errorcode[ctypes.get_errno()] if ret != 0 else 'done'\n"
        "print(err(libc.mount(None, b'/usr', None, ctypes.c_ulong(32 | 4096), None)))\n"  # MS_REMOUNT | MS_BIND: rw
        "print(err(libc.umount2(b'/sandbox', 2)))\n"
        "print(err(libc.chroot(b'/usr')))\n"
        "print(err(libc.setuid(0)))\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"  # every process it may signal: its own namespace's only
        "except ProcessLookupError:\n"
        "    print('ESRCH')\n"
    )
    r = run(code)
    assert r.stdout.split() == ["EPERM", "EPERM", "EPERM", "EINVAL", "ESRCH"], r  # EINVAL: uid 0 is not mapped


def test_no_network(run, monkeypatch):
    """With the audit hook's socket block off: only the network namespace stands between."""
    monkeypatch.setattr(sandbox_module, "_AUDIT_HOOK", False)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        code = attempts(
            f"connect: s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port}))",
            "interfaces: print(sorted(n for _, n in socket.if_nameindex()), file=sys.stderr)",
        ).replace("import json, os, sys", "import json, os, socket, sys")
        r = run(code)
        assert outcome(r)["connect"] in ("OSError", "ConnectionRefusedError"), r
        assert r.stderr.strip() == "['lo']"  # a fresh namespace: a loopback only
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the listener (a connection would be queued by now)
    finally:
        server.close()


def test_the_parents_environment_is_not_visible(run, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_SECRET", "s3cret")
    r = run("import os; print(sorted(os.environ)); print(os.environ.get('HYBRIDRL_SECRET'))")
    assert "s3cret" not in r.stdout and "HYBRIDRL_SECRET" not in r.stdout


def test_no_process_spawning_or_ctypes(run):
    assert "not allowed" in run("import subprocess; subprocess.run(['echo', 'hi'])").stderr
    assert "not allowed" in run("import os; os.system('echo hi')").stderr
    assert "not allowed" in run("import ctypes; ctypes.CDLL(None).system(b'echo hi')").stderr


def test_a_megabyte_of_output_is_cut(run):
    r = run("print('x' * 1_000_000)", max_output_bytes=1000)
    assert r.truncated and r.stdout == "x" * 1000 and r.exit_code == 0


def test_concurrency_is_bounded_and_the_event_loop_free(run):
    """Counted, not timed: the most runs inside the semaphore at once, and a task that needs 100
    turns of the event loop finishing while the snippets are still running."""
    sandbox = LocalSandbox(SandboxConfig(max_concurrency=2))
    inner, active, most = sandbox._run, [0], [0]

    async def counting(code, stdin):
        active[0] += 1
        most[0] = max(most[0], active[0])
        try:
            return await inner(code, stdin)
        finally:
            active[0] -= 1

    sandbox._run = counting

    async def spinner():
        for _ in range(100):
            await asyncio.sleep(0)

    async def main():
        runs = asyncio.ensure_future(asyncio.gather(*(sandbox.run("print(1)") for _ in range(5))))
        spin = asyncio.ensure_future(spinner())
        done, _ = await asyncio.wait({runs, spin}, return_when=asyncio.FIRST_COMPLETED)
        assert spin in done and runs not in done  # the loop turned while snippets ran
        return await runs

    results = asyncio.run(main())
    assert [r.stdout for r in results] == ["1\n"] * 5
    assert most[0] == 2


def test_a_setup_failure_is_one_line_and_nothing_runs(run, monkeypatch, tmp_path):
    """The snippet never runs half-isolated: a root that cannot be built is the run's one-line error."""
    sandbox = LocalSandbox(SandboxConfig())  # probed before the root is broken
    monkeypatch.setattr(sandbox_module, "_root_plan", lambda: ([("/usr", "/usr"), (str(tmp_path / "gone"), "/gone")], []))
    r = asyncio.run(sandbox.run("print('ran')"))
    assert (r.exit_code, r.stdout) == (EXIT_SETUP_FAILED, "")
    assert r.stderr.startswith("sandbox setup failed: opening") and r.stderr.count("\n") == 1, r.stderr


def test_it_refuses_to_start_where_the_kernel_refuses_namespaces(monkeypatch):
    monkeypatch.setitem(sandbox_module._NAMESPACES, "probe", "unshare failed: Operation not permitted")
    with pytest.raises(SandboxUnavailable, match="allow_unsafe_fallback") as e:
        LocalSandbox(SandboxConfig())
    assert "\n" not in str(e.value)
    assert LocalSandbox(SandboxConfig(allow_unsafe_fallback=True)).isolated is False


class FusionHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body.get("code") == "boom":
            self.send_response(500)
            self.end_headers()
            return
        result = {
            "status": "Success",
            "run_result": {"status": "Finished", "stdout": f"ran {len(body['code'])}", "stderr": "", "return_code": 0},
        }
        if body.get("code") == "slow":
            result["run_result"] = {"status": "TimeLimitExceeded", "stdout": "", "stderr": "", "return_code": None}
        data = json.dumps(result).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fusion_url():
    server = HTTPServer(("127.0.0.1", 0), FusionHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()
    server.server_close()


def test_sandbox_fusion_client(fusion_url):
    client = SandboxFusionClient(fusion_url, SandboxConfig(wall_timeout_s=2))
    r = asyncio.run(client.run("print(1)"))
    assert (r.stdout, r.exit_code) == ("ran 8", 0)
    assert asyncio.run(client.run("slow")).timed_out
    r = asyncio.run(client.run("boom"))
    assert r.exit_code is None and "HTTP 500" in r.stderr
    dead = SandboxFusionClient("http://127.0.0.1:9/run_code", SandboxConfig(wall_timeout_s=1), retries=1)
    r = asyncio.run(dead.run("print(1)"))
    assert "unreachable" in r.stderr
    with pytest.raises(ValueError, match="http:// or https://"):
        SandboxFusionClient("ftp://x")


def test_the_trainer_is_never_forked_and_the_limits_still_hold(run, monkeypatch):
    """A preexec_fn makes Python fork() the whole trainer (gigabytes resident, a CUDA context) for
    every snippet, serialised under the GIL: 0.30 s a call beside 6 GB resident against 0.08 s
    (measured here). The sandbox starts with vfork + exec and sets itself up in the child: the
    snippet still runs as PID 1 of its own namespace, with its limits and no network."""
    seen = []
    real = asyncio.create_subprocess_exec

    async def spy(*args, **kwargs):
        seen.append(kwargs)
        return await real(*args, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spy)
    code = (
        "import os, resource, socket\n"
        "print(os.getpid(), resource.getrlimit(resource.RLIMIT_AS)[0] >> 20, resource.getrlimit(resource.RLIMIT_CPU)[0])\n"
        "print(sorted(name for _, name in socket.if_nameindex()))\n"
    )
    r = run(code, memory_mb=300, cpu_s=2)
    assert seen and all(kw.get("preexec_fn") is None for kw in seen)
    first, nets = r.stdout.splitlines()
    assert first == "1 300 2", r
    assert nets in ("['lo']", "[]"), nets  # a fresh network namespace: the loopback only
