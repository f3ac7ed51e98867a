"""The compatibility wing (hybridrl/compat): it imports the core, the core never imports it; the config
loader reads verl's vocabulary only through the dialect the package installs (config/dialect.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config import dialect as dialect_module

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hybridrl"
# The edges that call the wing: the CLI, the Python API, the package (it installs the dialect), the wing itself.
EDGES = ("compat/", "cli/", "api.py", "__init__.py", "main_ppo.py", "main_dapo.py", "sft_trainer.py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


def test_the_core_never_imports_the_wing():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "__init__.py" or rel.startswith(EDGES[:2]) or rel in EDGES[2:]:
            continue
        if any(m == "hybridrl.compat" or m.startswith("hybridrl.compat.") for m in _imports(path)):
            offenders.append(rel)
    assert offenders == []


def test_the_wing_never_imports_the_front_doors():
    for path in sorted((PACKAGE / "compat").rglob("*.py")):
        bad = {m for m in _imports(path) if m.startswith(("hybridrl.cli", "hybridrl.api"))}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_import_hybridrl_leaves_the_wing_unloaded():
    code = "import sys, hybridrl; print(sorted(m for m in sys.modules if m.startswith('hybridrl.compat')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.fixture
def plain_keys(monkeypatch):
    """The config layer with no dialect installed, as a core without the wing."""
    monkeypatch.setattr(dialect_module, "_SOURCE", [dialect_module.PlainKeys])


def test_without_the_dialect_verl_keys_are_unknown_and_hybridrls_load(plain_keys, tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'actor_rollout_ref.rollout.load_format'"):
        load_config(None, ["actor_rollout_ref.rollout.load_format=dummy"])
    hydra = tmp_path / "x.yaml"
    hydra.write_text("defaults:\n  - base\n")
    with pytest.raises(ConfigError, match="unknown key 'defaults'"):
        load_config(hydra)
    assert load_config(None, ["data.train_batch_size=8"], check=False).data.train_batch_size == 8


def test_with_the_dialect_the_same_keys_are_verls(tmp_path):
    cfg = load_config(None, ["actor_rollout_ref.rollout.load_format=dummy"], check=False)
    assert any("actor_rollout_ref.rollout.load_format" in n for n in cfg.notices)
