"""A cgroup per snippet: memory and process limits over its whole tree, and a kill that reaches every
process of it, however it detached itself (a new session, a cleared parent-death signal, a double fork).

rlimits count one process: under RLIMIT_AS 256 MB, eight children held 1.6 GB, and memfd pages
(never address space) 880 MB more (issue 54). A cgroup counts the tree: `memory.max` covers anonymous
memory, memfd and tmpfs pages alike, `pids.max` every task. The setup process joins the snippet's
cgroup before it forks, so every process of the snippet is born inside, and none can leave (moving a
process needs write access to another cgroup's `cgroup.procs`, which the snippet's root does not hold).

Where a cgroup can be made, in order:
- cgroup v2, when the trainer's own cgroup or its parent has `memory` and `pids` enabled for its
  children (`cgroup.subtree_control`) and is writable: root on most systemd hosts, or a delegated
  slice. The snippet's cgroup is a child of that one. Nothing system-wide is switched on here.
- cgroup v1, when the `memory` and `pids` hierarchies are mounted and the trainer's cgroup in each is
  writable (hosts with the hybrid layout, e.g. this project's CI VM).
- none: the sandbox falls back to per-process rlimits (docs/sandbox.md says what that leaves open).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

PREFIX = "hybridrl-sandbox-"  # + the trainer's pid + a counter
_counter = itertools.count()


@dataclass(frozen=True)
class _Place:
    version: int  # 1 or 2
    base: str  # the directory the snippets' cgroups are made in
    controllers: tuple[str, ...]  # what that hierarchy limits: ("memory", "pids") in v2, one each in v1


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root of the hierarchy it shows, fstype, super options) of each cgroup mount."""
    found = []
    for line in _read("/proc/self/mountinfo").splitlines():
        fields, _, rest = line.partition(" - ")
        fields, rest = fields.split(), rest.split()
        if len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
            found.append((fields[4].replace("\\040", " "), fields[3], rest[0], set(rest[2].split(","))))
    return found


def _own() -> dict[str, str]:
    """The trainer's cgroup per controller ("" for the v2 hierarchy), from /proc/self/cgroup."""
    own = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def _inside(mount_point: str, mount_root: str, path: str) -> str | None:
    """The directory of cgroup `path` under a mount that shows the hierarchy from `mount_root`."""
    if mount_root != "/" and path != mount_root and not path.startswith(mount_root.rstrip("/") + "/"):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return os.path.join(mount_point, rel.lstrip("/")).rstrip("/")


def _find_places() -> tuple[list[_Place], str]:
    """Where snippets' cgroups can be made, or ([], why not)."""
    try:
        mounts, own = _mounts(), _own()
    except OSError as e:
        return [], f"cannot read the cgroup mounts: {e}"
    for mount_point, root, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        mine = _inside(mount_point, root, own[""])
        for base in [mine, os.path.dirname(mine)] if mine and mine != mount_point else [mine]:
            try:
                enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
            except (OSError, TypeError):
                continue
            if {"memory", "pids"} <= enabled and os.access(base, os.W_OK):
                return [_Place(2, base, ("memory", "pids"))], ""
    places = []
    for controller in ("memory", "pids"):
        for mount_point, root, fstype, options in mounts:
            if fstype == "cgroup" and controller in options and controller in own:
                base = _inside(mount_point, root, own[controller])
                if base and os.access(base, os.W_OK):
                    places.append(_Place(1, base, (controller,)))
                    break
    if len(places) == 2:
        return places, ""
    return [], (
        "no writable cgroup with the memory and pids controllers (v2: the trainer's cgroup or its parent must "
        "enable them in cgroup.subtree_control; v1: both hierarchies mounted and the trainer's cgroups writable)"
    )


class SnippetCgroup:
    """One snippet's cgroup (a directory in each place); `procs` are the files its setup writes its pid to."""

    def __init__(self, places: list[_Place], memory_mb: int, max_tasks: int):
        name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
        self.dirs = [(place, os.path.join(place.base, name)) for place in places]
        self.name = name
        made = []
        try:
            for place, path in self.dirs:
                os.mkdir(path, 0o755)
                made.append(path)
                for key, value in _limits(place, path, memory_mb << 20, max_tasks):
                    _write(os.path.join(path, key), value)
        except OSError:
            for path in made:
                os.rmdir(path)
            raise

    @property
    def procs(self) -> list[str]:
        return [os.path.join(path, "cgroup.procs") for _, path in self.dirs]

    def members(self) -> list[int]:
        pids: set[int] = set()
        for procs in self.procs:
            try:
                pids.update(int(p) for p in _read(procs).split())
            except OSError:
                pass
        return sorted(pids)

    def kill(self) -> None:
        """SIGKILL every process in it (cgroup.kill where the kernel has it, else one by one through pidfds,
        each checked to be still inside, so that a pid reused meanwhile is never hit)."""
        for place, path in self.dirs:
            if place.version == 2 and os.path.exists(os.path.join(path, "cgroup.kill")):
                _write(os.path.join(path, "cgroup.kill"), "1")
                return
        for pid in self.members():
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if self.name in _read(f"/proc/{pid}/cgroup"):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)

    def oom_kills(self) -> int:
        """Processes the kernel killed for going over memory.max."""
        for place, path in self.dirs:
            if "memory" in place.controllers:
                name = "memory.events" if place.version == 2 else "memory.oom_control"
                try:
                    fields = dict(line.split() for line in _read(os.path.join(path, name)).splitlines())
                    return int(fields.get("oom_kill", 0))
                except (OSError, ValueError):
                    return 0
        return 0

    def try_remove(self) -> bool:
        """Kill what is left and remove the directories; False while a process has not exited yet."""
        left = []
        for place, path in self.dirs:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                left.append((place, path))
        self.dirs = left
        if left:
            self.kill()
        return not left

    async def remove(self, within_s: float = 2.0) -> None:
        """`try_remove` until it succeeds (a cgroup goes once its last process has exited), at most `within_s`;
        what is still there then is swept by the next trainer that starts here (`_sweep`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not self.try_remove() and loop.time() < deadline:
            await asyncio.sleep(0.01)


def _limits(place: _Place, path: str, memory: int, max_tasks: int) -> list[tuple[str, str]]:
    limits = []
    if "memory" in place.controllers:
        if place.version == 2:
            limits += [("memory.max", str(memory))]
            limits += [("memory.swap.max", "0")] if os.path.exists(os.path.join(path, "memory.swap.max")) else []
        else:  # memsw (memory + swap) may only be set at or above the memory limit, so after it
            limits += [("memory.limit_in_bytes", str(memory))]
            has_swap = os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes"))
            limits += [("memory.memsw.limit_in_bytes", str(memory))] if has_swap else []
    if "pids" in place.controllers:
        limits.append(("pids.max", str(max_tasks)))
    return limits


def _sweep(places: list[_Place]) -> None:
    """Remove the empty cgroups of trainers that died before removing theirs (rmdir refuses a cgroup in use)."""
    for place in places:
        try:
            names = [n for n in os.listdir(place.base) if n.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            owner = name[len(PREFIX) :].split("-")[0]
            try:
                os.kill(int(owner), 0)
                continue  # its trainer is alive
            except ProcessLookupError:
                pass
            except (ValueError, PermissionError):
                continue
            try:
                os.rmdir(os.path.join(place.base, name))
            except OSError:
                pass


def leftovers() -> list[str]:
    """This process's snippet cgroups that still exist (none between runs)."""
    places, _ = _probe()
    mine = f"{PREFIX}{os.getpid()}-"
    return sorted(n for p in places for n in os.listdir(p.base) if n.startswith(mine))


_PROBE: dict[str, tuple[list[_Place], str]] = {}


def _probe() -> tuple[list[_Place], str]:
    """Once per process: find the places, make one cgroup and have a fresh process join it."""
    if "result" not in _PROBE:
        places, why = _find_places()
        if places:
            _sweep(places)
            try:
                cgroup = SnippetCgroup(places, 64, 8)
            except OSError as e:
                places, why = [], f"cannot make a cgroup in {places[0].base}: {e.strerror}"
            else:
                join = "import os, sys\nfor p in sys.argv[1:]:\n    open(p, 'w').write(str(os.getpid()))"
                r = subprocess.run([sys.executable, "-I", "-S", "-c", join, *cgroup.procs], capture_output=True)
                cgroup.try_remove()
                if r.returncode != 0:
                    last = r.stderr.decode(errors="replace").strip().splitlines()[-1:]
                    places, why = [], f"a process cannot join a cgroup made in {places[0].base}: {' '.join(last)}"
        _PROBE["result"] = (places, why)
    return _PROBE["result"]


def cgroup_places() -> list[_Place]:
    """Where this process makes its snippets' cgroups ([] where it cannot)."""
    return _probe()[0]


def cgroup_available() -> str | None:
    """None when each snippet gets its own cgroup here, else why not."""
    places, why = _probe()
    return None if places else why
