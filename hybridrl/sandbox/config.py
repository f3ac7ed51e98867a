"""What a sandbox run is given (its limits) and what it returns; shared by the local sandbox and the
SandboxFusion client."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


class SandboxUnavailable(RuntimeError):
    """The kernel does not allow the isolation the sandbox needs (and no fallback is allowed)."""


@dataclass
class SandboxConfig:
    """Limits of one execution (the python tool's `config:` keys of the same names)."""

    wall_timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 1024  # each process's address space (RLIMIT_AS) and, where a cgroup can be made, all the
    # memory of the snippet's processes together, memfd and tmpfs pages included (memory.max)
    max_output_bytes: int = 8192  # of stdout and of stderr each
    max_file_mb: int = 16  # largest file it may write (RLIMIT_FSIZE)
    max_disk_mb: int = 64  # all it may write (the size of its working tmpfs)
    max_processes: int = 16  # processes (and threads) the snippet may add, its whole tree counted (pids.max)
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
