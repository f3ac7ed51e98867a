"""Size limits that keep the hot parts readable (issue 53), and no private names taken across modules.

- rollout/native/engine.py stays at most ENGINE_MAX_LINES lines (the engine facade; one call's loop is
  generation.py, the model runner runner.py);
- no class in hybridrl/rollout/ or hybridrl/workers/ defines more than MAX_METHODS methods (split a
  concern into a collaborator instead: the runner's weights are `WeightLoader`, its cache size `CacheBudget`);
- no module imports another module's private (`_name`) names, nor reads them off an imported module.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "hybridrl"
ENGINE_MAX_LINES = 450
MAX_METHODS = 18
METHOD_LIMIT_DIRS = ("rollout", "workers")

# (importing file, private name): known offenders, each until the branch rewriting its area lands (a
# stale entry fails the last test). None are left.
PRIVATE_ALLOWED: set[tuple[str, str]] = set()


def _files() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _module_names() -> set[str]:
    names = set()
    for p in _files():
        parts = p.relative_to(REPO).with_suffix("").parts
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def method_counts(tree: ast.AST) -> dict[str, int]:
    """{class name: the functions its body defines} for every class in `tree`."""
    return {
        node.name: sum(isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)) for b in node.body)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def private_imports(path: Path, modules: set[str], root: Path = REPO) -> list[tuple[str, int]]:
    """(private name, line) of every `from <hybridrl module> import _name` in `path` (under `root`),
    and every `mod._name` read off a hybridrl module bound by an import (dunder names are public)."""
    tree = ast.parse(path.read_text())
    pkg = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    out, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("hybridrl"):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append((alias.name, node.lineno))
                elif f"{base}.{alias.name}" in modules:
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            bound.update(a.asname for a in node.names if a.asname and a.name in modules)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            out.append((node.attr, node.lineno))
    return out


def test_native_engine_module_stays_short():
    lines = len((PKG / "rollout" / "native" / "engine.py").read_text().splitlines())
    assert lines <= ENGINE_MAX_LINES, (
        f"hybridrl/rollout/native/engine.py has {lines} lines (limit {ENGINE_MAX_LINES}): move a whole part into "
        "its own module (generation.py, runner.py, weights.py are examples)"
    )


def test_no_class_in_rollout_or_workers_has_too_many_methods():
    over = []
    for d in METHOD_LIMIT_DIRS:
        for path in sorted((PKG / d).rglob("*.py")):
            for name, n in method_counts(ast.parse(path.read_text())).items():
                if n > MAX_METHODS:
                    over.append(f"{_rel(path)}: {name} has {n} methods")
    assert not over, f"over {MAX_METHODS} methods (move a concern into a collaborator): " + "; ".join(over)


def test_no_private_names_cross_modules():
    modules = _module_names()
    found = []
    for path in _files():
        for name, line in private_imports(path, modules):
            if (_rel(path), name) not in PRIVATE_ALLOWED:
                found.append(f"{_rel(path)}:{line} takes {name}")
    assert not found, "private names used across modules (make them public or move the code): " + "; ".join(found)


def test_allowed_private_imports_still_exist():
    """An entry whose import is gone is dropped from PRIVATE_ALLOWED, so the list only shrinks."""
    modules = _module_names()
    present = {(_rel(p), name) for p in _files() for name, _ in private_imports(p, modules)}
    assert not PRIVATE_ALLOWED - present, f"drop these from PRIVATE_ALLOWED: {sorted(PRIVATE_ALLOWED - present)}"


def test_the_checks_see_what_they_guard(tmp_path):
    """The counters themselves: a class's methods, a private import and a private attribute read."""
    tree = ast.parse(
        "class A:\n    def a(self): ...\n    async def b(self): ...\n    x = 1\n    class B:\n        def c(self): ...\n"
    )
    assert method_counts(tree) == {"A": 2, "B": 1}
    src = tmp_path / "hybridrl" / "pkg" / "m.py"
    src.parent.mkdir(parents=True)
    src.write_text(
        "from hybridrl.data.dataset import _hidden, public\n"
        "from . import other as o\n"
        "import hybridrl.data.batch as b\n"
        "o._inner()\nb._x\nb.__doc__\n"
    )
    found = private_imports(src, {"hybridrl.pkg.other", "hybridrl.data.batch", "hybridrl.data.dataset"}, tmp_path)
    assert sorted(found) == [("_hidden", 1), ("_inner", 4), ("_x", 5)]
