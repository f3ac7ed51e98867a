"""Every skipped test has a reason CI accepts, so a test that starts skipping by accident (an import
that fails, a fixture that no longer finds what it needs) fails CI instead of passing unseen.

Allowed: hardware the CPU CI machine does not have, tests that run another way on this machine,
and TRL (a benchmark's dependency only). Anything else — a missing test dependency (ray, Chromium),
no Linux namespaces for the sandbox's security tests, a shipped file that vanished — is not. With HYBRIDRL_STRICT_SKIPS=1
(set by .ci/run) such a skip fails the session; without it the summary lists it.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest

ALLOWED = (
    # hardware the CPU CI machine lacks
    "needs CUDA",
    "needs a GPU",
    "needs 2 GPUs",
    "needs 2 CUDA devices",
    "this machine has CUDA",
    # a privileged mount (the disk-full tests fill a small tmpfs)
    "cannot mount a tmpfs here",
    # the same tests run another way here
    "run by test_kernels_under_the_triton_interpreter",
    "the kernel tests run directly here",
    "triton is available on Linux only",
    "vllm is installed here",
    "joins an existing cluster",
    # a benchmark-only dependency, deliberately not in the test extras (tests/e2e/test_vs_trl.py)
    "trl is not installed",
)
STRICT_ENV = "HYBRIDRL_STRICT_SKIPS"


def reason_of(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def unexpected(reasons: list[str]) -> Counter:
    """The reasons (with counts) that no allowed prefix covers."""
    return Counter(r for r in reasons if not r.startswith(ALLOWED))


def _skipped(reporter) -> list[str]:
    if reporter is None:
        return []
    return [reason_of(r) for r in reporter.stats.get("skipped", []) if getattr(r, "longrepr", None) is not None]


def pytest_sessionfinish(session, exitstatus) -> None:
    bad = unexpected(_skipped(session.config.pluginmanager.get_plugin("terminalreporter")))
    if bad and os.environ.get(STRICT_ENV, "") not in ("", "0") and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    bad = unexpected(_skipped(terminalreporter))
    if not bad:
        return
    strict = os.environ.get(STRICT_ENV, "") not in ("", "0")
    terminalreporter.section("skips without an allowed reason (tests/skip_policy.py)", red=strict, yellow=not strict)
    for reason, n in bad.most_common():
        terminalreporter.line(f"{n:4d}  {reason}")
    if strict:
        terminalreporter.line(
            f"{STRICT_ENV}=1: these skips fail the run; fix the cause or allow the reason in tests/skip_policy.py"
        )
