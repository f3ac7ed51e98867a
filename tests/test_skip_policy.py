"""The skip policy (tests/skip_policy.py): an unlisted skip fails a strict run, listed ones do not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from skip_policy import unexpected

ROOT = Path(__file__).resolve().parents[1]


def test_reasons_are_matched_by_prefix():
    assert not unexpected(["needs CUDA", "needs 2 GPUs for the NCCL test", "this machine has CUDA"])
    assert unexpected(["could not import 'ray': No module named 'ray'", "needs CUDA"]) == {
        "could not import 'ray': No module named 'ray'": 1
    }


def _run(tmp_path, body: str, strict: bool):
    test = tmp_path / "test_probe.py"
    test.write_text(body)
    conftest = tmp_path / "conftest.py"
    hook = "from skip_policy import pytest_sessionfinish, pytest_terminal_summary\n"
    conftest.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n" + hook)
    env = {"PATH": "/usr/bin:/bin", "HYBRIDRL_STRICT_SKIPS": "1" if strict else "0", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(test)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )


def test_an_accidental_skip_fails_a_strict_run(tmp_path):
    body = "import pytest\n\ndef test_a():\n    pytest.importorskip('no_such_module_here')\n\ndef test_b():\n    pass\n"
    strict = _run(tmp_path, body, strict=True)
    assert strict.returncode == 1 and "no_such_module_here" in strict.stdout, strict.stdout
    lenient = _run(tmp_path, body, strict=False)
    assert lenient.returncode == 0 and "skips without an allowed reason" in lenient.stdout, lenient.stdout


def test_allowed_skips_pass_a_strict_run(tmp_path):
    body = "import pytest\n\n@pytest.mark.skipif(True, reason='needs CUDA')\ndef test_a():\n    pass\n"
    proc = _run(tmp_path, body, strict=True)
    assert proc.returncode == 0, proc.stdout
