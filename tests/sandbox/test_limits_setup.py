"""The parts of the sandbox's limits that do not need a snippet: where a per-snippet cgroup is made on
each cgroup layout (the kernel's files faked in a folder; the real layout of this machine is exercised by
test_containment.py), and the seccomp program, run through a small classic-BPF interpreter for each
architecture it knows."""

from __future__ import annotations

import struct

import pytest

from hybridrl.sandbox import cgroup
from hybridrl.sandbox.seccomp import _AUDIT_ARCH, KEY_SYSCALLS, keyring_filter

ALLOW, EPERM = 0x7FFF0000, 0x00050001


def run_bpf(program: bytes, nr: int, arch: int) -> int:
    """What the filter returns for syscall `nr` of `arch` (struct seccomp_data: nr at 0, arch at 4)."""
    data = struct.pack("=iI", nr, arch) + bytes(56)
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    for _ in range(len(insns)):  # no loops in classic BPF: every jump goes forward
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
        elif code in (0x15, 0x35):  # BPF_JEQ / BPF_JGE with a constant
            pc += jt if (acc == k if code == 0x15 else acc >= k) else jf
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1
    raise AssertionError("ran off the end of the program")


@pytest.mark.parametrize("machine", sorted(KEY_SYSCALLS))
def test_the_filter_refuses_exactly_the_key_syscalls(machine):
    program = keyring_filter(machine)
    arch = _AUDIT_ARCH[machine]
    refused = [nr for nr in range(0, 600) if run_bpf(program, nr, arch) != ALLOW]
    assert refused == sorted(KEY_SYSCALLS[machine])
    assert {run_bpf(program, nr, arch) for nr in refused} == {EPERM}
    assert run_bpf(program, 0, 0x40000003) == EPERM  # another ABI (i386): refused whole
    if machine == "x86_64":
        assert run_bpf(program, 0x40000000 + 250, arch) == EPERM  # x32 numbers
    assert keyring_filter("sparc64") is None


def layout(tmp_path, monkeypatch, mounts, own, files):
    """A fake /proc/self/mountinfo + /proc/self/cgroup and cgroup folders (paths under tmp_path)."""
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    mounts = [(str(tmp_path / mp), root, fstype, set(opts)) for mp, root, fstype, opts in mounts]
    monkeypatch.setattr(cgroup, "_mounts", lambda: mounts)
    monkeypatch.setattr(cgroup, "_own", lambda: own)
    return [(p.version, p.base[len(str(tmp_path)) + 1 :], p.controllers) for p in cgroup._find_places()[0]]


def test_v2_uses_the_trainers_cgroup_or_its_parent_where_they_enable_memory_and_pids(tmp_path, monkeypatch):
    v2 = [("unified", "/", "cgroup2", ())]
    # systemd user slice: the trainer's scope holds processes (no controllers for children); its parent delegates
    files = {"unified/user.slice/app.slice/cgroup.subtree_control": "cpu memory pids\n",
             "unified/user.slice/app.slice/run.scope/cgroup.subtree_control": "\n"}  # fmt: skip
    own = {"": "/user.slice/app.slice/run.scope"}
    assert layout(tmp_path, monkeypatch, v2, own, files) == [(2, "unified/user.slice/app.slice", ("memory", "pids"))]
    # root (a VM, or a container's cgroup namespace root with its controllers delegated)
    files = {"unified/cgroup.subtree_control": "memory pids io\n"}
    assert layout(tmp_path / "b", monkeypatch, v2, {"": "/"}, files) == [(2, "unified", ("memory", "pids"))]
    # a mount that shows the hierarchy from /docker/abc: the path is taken relative to it
    v2 = [("cg", "/docker/abc", "cgroup2", ())]
    files = {"cg/cgroup.subtree_control": "memory pids\n", "cg/job/cgroup.subtree_control": ""}
    assert layout(tmp_path / "c", monkeypatch, v2, {"": "/docker/abc/job"}, files) == [(2, "cg", ("memory", "pids"))]


def test_v1_needs_both_hierarchies_and_nothing_is_switched_on(tmp_path, monkeypatch):
    mounts = [("unified", "/", "cgroup2", ()), ("memory", "/", "cgroup", ("rw", "memory")), ("pids", "/", "cgroup", ("pids",))]
    own = {"": "/", "memory": "/jobs/7", "pids": "/"}
    files = {"unified/cgroup.subtree_control": "hugetlb\n", "memory/jobs/7/tasks": "", "pids/tasks": ""}
    assert layout(tmp_path, monkeypatch, mounts, own, files) == [(1, "memory/jobs/7", ("memory",)), (1, "pids", ("pids",))]
    assert (tmp_path / "unified/cgroup.subtree_control").read_text() == "hugetlb\n"  # v2 left as it was
    mounts = mounts[:2]  # no pids hierarchy: no cgroup at all, and a reason
    files = {"unified/cgroup.subtree_control": "", "memory/jobs/7/tasks": ""}
    assert layout(tmp_path / "b", monkeypatch, mounts, own, files) == []
    assert "memory and pids" in cgroup._find_places()[1]
