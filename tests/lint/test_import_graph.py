"""hybridrl's imports point down the layers of ARCHITECTURE.md and never loop (issue 53).

Every import statement counts, also one inside a function or under `if TYPE_CHECKING:`: a lazy
import is still a dependency, only a later one. Parsed with `ast`, nothing is imported.
"""

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# ARCHITECTURE.md "Layers" as rows, top to bottom. A module may import the modules of its own package
# and of every package in a lower row; never a row above, nor another package of its own row. A
# package is a directory under hybridrl/ or a top-level module (`__init__` is hybridrl/__init__.py).
# The table's "may import" lists are read downwards: data, config and tracking (Batch and its keys,
# the config, metrics) are what every layer reads; distributed applies parallelism to models from
# outside them (STYLE.md) and prepares the rollout engine's process (its CUDA allocator option).
LAYERS = (
    ("__main__", "main_ppo", "main_dapo", "sft_trainer"),  # `python -m hybridrl`, verl's module entry points
    ("cli", "__init__"),  # `hybridrl ...`; `import hybridrl` (the API's names, the registries handed to config)
    ("api",),  # the Python API (RLTrainer): builds the run the CLI builds
    ("launch",),  # the one launch path the CLI and the API share
    ("preflight", "inputs"),  # what is checked before a run starts; the API's objects as what a config names
    ("trainer",),
    ("workers",),
    ("distributed",),
    ("rollout",),  # engines and the agent loop, which may score with rewards
    ("models", "algorithms", "rewards"),
    ("sandbox",),  # isolated code execution: the code reward's and the agent tools'
    ("config", "data", "tracking"),
)
# The compatibility wing (verl / TRL vocabularies) imports the core and may import anything; only
# the edge (the three top rows: command lines and the Python API) may import it.
COMPAT = ("compat",)
COMPAT_USERS = LAYERS[0] + LAYERS[1] + LAYERS[2]

# Known offenders in areas another branch is rewriting, each until that branch lands
# (test_allow_lists_hold_only_live_entries fails once an entry is stale). None are left.
ALLOWED_LOOPS: set[frozenset[str]] = set()
ALLOWED_EDGES: set[tuple[str, str]] = set()


def modules(root: Path) -> dict[str, Path]:
    """{dotted module name: file} of every module under root/hybridrl (a package by its __init__.py)."""
    out = {}
    for path in sorted((root / "hybridrl").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _longest_module(name: str, mods: dict[str, Path]) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def statements(node: ast.AST):
    """Every statement under `node`, at any depth (function and class bodies, branches, handlers):
    where an import can stand, without walking the expressions."""
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, field, ()):
            if isinstance(child, ast.stmt):
                yield child
            yield from statements(child)


def imported(path: Path, root: Path, mods: dict[str, Path]) -> set[str]:
    """The hybridrl modules `path` imports. `from p import x` is module p.x when that is one, else p
    (x is a name p defines); the packages above a module, which Python initializes on the way, are
    not counted unless named."""
    rel = path.relative_to(root).with_suffix("").parts
    package = rel[:-1]  # a module's package; for an __init__.py, the package itself
    out = set()
    for node in statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(_longest_module(a.name, mods) for a in node.names if a.name.split(".")[0] == "hybridrl")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] != "hybridrl":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in mods else _longest_module(base, mods))
    out.discard(None)
    return out


@functools.lru_cache(maxsize=4)
def graph(root: Path = REPO) -> tuple[dict[str, Path], dict[str, set[str]]]:
    """({module: file}, {module: the modules it imports}) of root/hybridrl (parsed once per root)."""
    mods = modules(root)
    return mods, {m: imported(p, root, mods) - {m} for m, p in mods.items()}


def loops(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def row_of(package: str) -> int | None:
    return next((i for i, row in enumerate(LAYERS) if package in row), None)


def layer_problem(src: str, dst: str) -> str | None:
    """Why importing module `dst` from module `src` breaks the layering (None: it does not)."""
    a, b = package_of(src), package_of(dst)
    if a == b or a in COMPAT:
        return None
    if b in COMPAT:
        return None if a in COMPAT_USERS else f"imports the compatibility wing ({b}), which only {COMPAT_USERS} may"
    ra, rb = row_of(a), row_of(b)
    for pkg, r in ((a, ra), (b, rb)):
        if r is None:
            return f"hybridrl/{pkg} is in no row of LAYERS: place it there (tests/lint/test_import_graph.py)"
    if ra == rb:
        return f"{a} and {b} are peers of one layer: move the shared part down a layer"
    if rb < ra:
        return f"points up a layer ({a} -> {b})"
    return None


def _file(mod: str, mods: dict[str, Path], root: Path) -> str:
    return mods[mod].relative_to(root).as_posix()


def layering_problems(root: Path = REPO) -> list[str]:
    mods, edges = graph(root)
    out = []
    for src in sorted(edges):
        for dst in sorted(edges[src]):
            why = layer_problem(src, dst)
            pair = (_file(src, mods, root), _file(dst, mods, root))
            if why and pair not in ALLOWED_EDGES:
                out.append(f"{pair[0]} -> {pair[1]}: {why}")
    return out


def loop_problems(root: Path = REPO) -> list[str]:
    mods, edges = graph(root)
    found = [frozenset(_file(m, mods, root) for m in comp) for comp in loops(edges)]
    return [" <-> ".join(sorted(comp)) for comp in found if comp not in ALLOWED_LOOPS]


def test_no_import_loops():
    problems = loop_problems()
    assert not problems, "import loops (move what both sides need into a module below them):\n" + "\n".join(problems)


def test_imports_point_down_the_layers():
    problems = layering_problems()
    assert not problems, "imports against ARCHITECTURE.md's layers:\n" + "\n".join(problems)


def test_every_package_has_a_row():
    mods = modules(REPO)
    placed = {p for row in LAYERS for p in row} | set(COMPAT)
    missing = sorted({package_of(m) for m in mods} - placed)
    assert not missing, f"packages in no row of LAYERS: {missing}"


def test_allow_lists_hold_only_live_entries():
    """An offender that is gone leaves the allow-lists, so they only shrink."""
    mods, edges = graph(REPO)
    live_loops = {frozenset(_file(m, mods, REPO) for m in comp) for comp in loops(edges)}
    live_edges = {(_file(a, mods, REPO), _file(b, mods, REPO)) for a in edges for b in edges[a]}
    stale = sorted(map(sorted, ALLOWED_LOOPS - live_loops)) + sorted(ALLOWED_EDGES - live_edges)
    assert not stale, f"fixed now: drop these entries from ALLOWED_LOOPS / ALLOWED_EDGES: {stale}"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "hybridrl" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_graph_sees_lazy_relative_and_aliased_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "data/__init__.py": "from .batch import Batch\n",
            "data/batch.py": "class Batch: ...\n",
            "models/__init__.py": "",
            "models/a.py": "def f():\n    from ..data import Batch\n    import hybridrl.data.batch as b\n",
            "models/b.py": "from hybridrl.models import a\nfrom hybridrl import data\n",
        },
    )
    _, edges = graph(root)
    assert edges["hybridrl.models.a"] == {"hybridrl.data", "hybridrl.data.batch"}
    assert edges["hybridrl.models.b"] == {"hybridrl.models.a", "hybridrl.data"}
    assert edges["hybridrl.data"] == {"hybridrl.data.batch"}


def test_a_planted_loop_and_upward_import_are_reported(tmp_path):
    """The wires: a loop through a lazy import, an import up a layer, one between peers, one into the wing."""
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "config/__init__.py": "",
            "config/a.py": "from hybridrl.config import b\n",
            "config/b.py": "def f():\n    from hybridrl.config.a import x\n",
            "data/__init__.py": "",
            "data/batch.py": "from hybridrl.models.packing import pack\n",
            "models/__init__.py": "",
            "models/packing.py": "from hybridrl.data.batch import Batch\nfrom hybridrl.rewards import gsm8k\n",
            "rewards/__init__.py": "",
            "rewards/gsm8k.py": "",
            "compat/__init__.py": "from hybridrl.models import packing\n",
            "trainer/__init__.py": "from hybridrl import compat\n",
        },
    )
    assert sorted(loop_problems(root)) == [
        "hybridrl/config/a.py <-> hybridrl/config/b.py",
        "hybridrl/data/batch.py <-> hybridrl/models/packing.py",
    ]
    problems = layering_problems(root)
    assert len(problems) == 3, problems
    assert problems[0].startswith("hybridrl/data/batch.py -> hybridrl/models/packing.py: points up a layer")
    assert problems[1].startswith("hybridrl/models/packing.py -> hybridrl/rewards/gsm8k.py: models and rewards are peers")
    assert problems[2].startswith("hybridrl/trainer/__init__.py -> hybridrl/compat/__init__.py: imports the compatibility wing")
