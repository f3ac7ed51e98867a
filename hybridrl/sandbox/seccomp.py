"""The sandbox's seccomp filter: the kernel keyring syscalls fail with EPERM.

A process inherits its parent's session keyring, and possessing a keyring grants every right on it,
whatever the uid: a snippet could read, add to and clear the trainer's keys (issue 54). The setup
joins the snippet to a fresh anonymous session keyring, and this filter refuses `add_key`,
`request_key` and `keyctl` outright, so the snippet cannot reach a keyring by serial number either.
Syscalls of another ABI (i386 through `int 0x80`, x32 on x86-64) are refused whole, since their
numbers differ. The program is classic BPF (linux/seccomp.h, linux/filter.h), built here and
installed by setup_child.py with prctl(PR_SET_SECCOMP) after no_new_privs.
"""

from __future__ import annotations

import platform
import struct

# (add_key, request_key, keyctl) per architecture: arch/x86/entry/syscalls/syscall_64.tbl and the generic
# table (include/uapi/asm-generic/unistd.h) that arm64 uses.
KEY_SYSCALLS = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # AUDIT_ARCH_X86_64, AUDIT_ARCH_AARCH64
_X32_SYSCALL_BIT = 0x40000000

_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...
_RET_ALLOW, _RET_ERRNO, _EPERM = 0x7FFF0000, 0x00050000, 1
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def keyring_filter(machine: str | None = None) -> bytes | None:
    """The filter as `struct sock_filter[]` bytes; None on an architecture without known numbers."""
    machine = machine or platform.machine()
    if machine not in KEY_SYSCALLS:
        return None
    denied = KEY_SYSCALLS[machine]
    # instructions: ld arch; jeq arch (else deny); ld nr; [jge x32 -> deny]; jeq nr -> deny (each); allow; deny
    body = [(_LD_W_ABS, _ARCH), (_JEQ_K, _AUDIT_ARCH[machine]), (_LD_W_ABS, _NR)]
    if machine == "x86_64":
        body.append((_JGE_K, _X32_SYSCALL_BIT))
    body += [(_JEQ_K, nr) for nr in denied]
    deny = len(body) + 1  # the index of the last instruction
    program = []
    for i, (code, k) in enumerate(body):
        to_deny = deny - (i + 1)  # jumps count from the next instruction
        if i == 1:
            jt, jf = 0, to_deny  # the expected arch: go on; another: deny
        elif code in (_JEQ_K, _JGE_K):
            jt, jf = to_deny, 0
        else:
            jt, jf = 0, 0
        program.append(struct.pack("=HBBI", code, jt, jf, k))
    program.append(struct.pack("=HBBI", _RET_K, 0, 0, _RET_ALLOW))
    program.append(struct.pack("=HBBI", _RET_K, 0, 0, _RET_ERRNO | _EPERM))
    return b"".join(program)
