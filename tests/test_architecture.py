"""The floors of docs/ARCHITECTURE.md, enforced: no import cycle between packages, no floor importing a higher one.

Every module under src/layerscope is parsed with ``ast`` and every import in it is read, the ones
inside functions too (a lazy import is still a dependency).  Each module belongs to a unit: its
package (``layerscope.export.cache`` -> ``export``), or itself for a top-level module
(``layerscope.cli`` -> ``cli``).  Each unit has a floor (FLOORS, from the architecture plan), and
a unit may import only units on its own floor or below, and never so that units import each other
round a circle.

Inside the packages the same parse gives a graph of modules: no two modules may import each other round a
circle, neither through the imports that run when a module is imported nor through those inside functions (a
lazy import hides a circle, it does not remove it); and no module may be longer than MAX_LINES.

PENDING lists the edges that another engineer of issue 10 is removing on a branch of their own;
each names its owner and why it is still here.  It only shrinks: a test fails as soon as an entry
is no longer needed (the edge is gone or no longer breaks a rule), so it cannot rot.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "layerscope"
ROOT_UNIT = "layerscope"  # the package's own __init__ as an importer: layerscope.open() (lazy, an entry point)
# ``import layerscope`` elsewhere reads ``layerscope.__version__``; the package's __init__ imports nothing at
# import time, so such an import counts as one of this floor-0 unit, not of the entry point.
VERSION_UNIT = "__version__"

# Lower floors never import higher ones.  Units on one floor may import each other if no cycle forms.
FLOORS: dict[str, int] = {
    # 0: utilities
    "errors": 0, "jsonfile": 0, "atomic": 0, "hashing": 0, "ownership": 0, "owned_record": 0, "out_lock": 0, "limits": 0, "progress": 0, "signals": 0, VERSION_UNIT: 0,
    # 1: vocabulary, pure metrics, readers and generators
    "vocab": 1, "metrics": 1, "data": 1,
    # 2: what a model is: families, source loading, manifest, handle, tokenization, st recipe
    "model": 2,
    # 3: engines and their registry
    "engines": 3,
    # 4: the exporter and open_engine()
    "export": 4,
    # 5: the LayerStore and its parts; the cache-root and verify helpers that read stores and exports
    "store": 5, "cachedir": 5, "integrity": 5,
    # 6: extraction into a store (requests, preparation, executors); indexes, which embed their queries
    "extraction": 6, "index": 6,
    # 7: decoding heads and games, analyses; report's plots, tables and writers, which the analyses draw
    # with (the plan had report on 8, the code has analyses calling report.plots/writer); session
    # (layerscope.open), which the MTEB analysis wraps its engine in (the plan had it on 9)
    "decoding": 7, "analyses": 7, "report": 7, "session": 7,
    # 8: bench
    "bench": 8,
    # 9: the command line and the package's entry points
    "cli": 9, "__main__": 9, ROOT_UNIT: 9,
}

# Units that may import only the units named (beyond the standard library and third-party packages).
ONLY: dict[str, set[str]] = {"vocab": {"errors"}}

# Imports being removed while work is merged, one (importing module, imported module) each (so that nothing
# else slips through on the same pair of packages) -> (owner, why); empty once merged.
PENDING: dict[tuple[str, str], tuple[str, str]] = {
}


# Longest a module may be (lines, as ``wc -l`` counts them).
MAX_LINES = 450

# Known exceptions, each -> (owner, why): circles closed only through an import inside a function, and modules
# over MAX_LINES. None is left; a test fails as soon as an entry is not needed.
KNOWN_EXCEPTIONS: dict[str, tuple[str, str]] = {}


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in (``a.b.c`` where ``a.b`` is a module -> ``a.b``)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return None


def _import_nodes(tree: ast.AST, lazy: bool):
    """``(node, inside a function)`` for every node of ``tree``; with ``lazy`` False, only the nodes that run when
    the module is imported (function bodies left out; class bodies and ``if TYPE_CHECKING`` blocks kept: a name
    imported for an annotation still ties the two modules together)."""
    todo = [(tree, False)]
    while todo:
        node, inside = todo.pop()
        yield node, inside
        for child in ast.iter_child_nodes(node):
            in_function = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if lazy or not in_function:
                todo.append((child, in_function))


def _imports(module: str, path: Path, known: dict[str, Path], lazy: bool = True):
    """``(imported module, line)`` for every import of a layerscope module in ``path``, at any depth (with ``lazy``
    False: only the imports that run when ``path`` is imported)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    for node, _ in sorted(_import_nodes(tree, lazy), key=lambda n: getattr(n[0], "lineno", 0)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield _resolve(alias.name, known), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: count up from this module's package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:  # ``from layerscope.export import cache`` imports the module export.cache
                full = f"{base}.{alias.name}"
                yield (full if full in known else _resolve(base, known)), node.lineno


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_UNIT


def import_graph(skip: dict | None = None) -> dict[tuple[str, str], list[str]]:
    """``{(importer unit, imported unit): ["module:line imports module", ...]}`` over every layerscope module,
    leaving out the (importing module, imported module) pairs in ``skip``."""
    known = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in known.items():
        for target, line in _imports(module, path, known):
            if target is None or (module, target) in (skip or {}):
                continue
            a, b = _unit(module), (VERSION_UNIT if target == PACKAGE else _unit(target))
            if a != b:
                edges[a, b].append(f"{module}:{line} imports {target}")
    return dict(edges)


def _floor_violations(edges) -> dict[tuple[str, str], str]:
    bad = {}
    for (a, b), where in edges.items():
        if a in FLOORS and b in FLOORS and FLOORS[a] < FLOORS[b]:
            bad[a, b] = f"{a} (floor {FLOORS[a]}) imports {b} (floor {FLOORS[b]}): {where[0]}"
        elif a in ONLY and b not in ONLY[a]:
            bad[a, b] = f"{a} may import only {sorted(ONLY[a])}, and imports {b}: {where[0]}"
    return bad


def _cycles(edges) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    return [_one_cycle(sorted(comp)[0], set(comp), graph) for comp in _components(edges)]


def _components(edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(set(graph) | {b for _, b in edges}):
        if v not in index:
            visit(v)
    return components


def _one_cycle(start: str, comp: set[str], graph) -> list[str]:
    """A shortest path start -> ... -> start inside one component."""
    from collections import deque

    prev: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph[v] & comp):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return [start] + path[::-1][1:] + [start] if v != start else [start, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return [start]


def _describe_cycle(cycle: list[str], edges) -> str:
    steps = [f"{a} -> {b} ({edges[a, b][0]})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle " + " -> ".join(cycle) + ":\n    " + "\n    ".join(steps)


def test_every_unit_has_a_floor():
    """Catches: a new package or top-level module that no floor was chosen for (its imports would go unchecked)."""
    units = {_unit(m) for m in _modules()} | {b for _, b in import_graph()}
    assert sorted(units - set(FLOORS)) == []


def test_the_package_init_imports_nothing_at_import_time():
    """What VERSION_UNIT relies on: ``import layerscope`` runs no import of a layerscope module (open() is lazy)."""
    tree = ast.parse((SRC / PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) and "layerscope" in ast.dump(n)]


def test_no_lower_floor_imports_a_higher_one():
    """Catches: e.g. model/ importing export/ (the handle running an export), engines/ importing export/."""
    bad = _floor_violations(import_graph(skip=PENDING))
    assert not bad, "\n".join(bad.values())


def test_no_import_cycle_between_packages():
    """Catches: e.g. engines -> export -> engines (an engine constructor that runs an export)."""
    edges = import_graph(skip=PENDING)
    cycles = _cycles(edges)
    assert not cycles, "\n".join(_describe_cycle(c, edges) for c in cycles)


def test_every_pending_edge_is_still_needed():
    """Catches: an allowlist entry whose edge is gone or no longer breaks a rule (remove it from PENDING)."""
    edges = import_graph()
    floor_bad = _floor_violations(edges)
    stale = []
    for (module, target), (owner, why) in PENDING.items():
        edge = (_unit(module), _unit(target))
        if not any(w.startswith(f"{module}:") and w.endswith(f" imports {target}") for w in edges.get(edge, [])):
            stale.append(f"{module} -> {target} ({owner}: {why}): {module} does not import {target} any more")
        elif edge not in floor_bad and not _edge_in_a_cycle(edge, edges):
            stale.append(f"{module} -> {target} ({owner}: {why}): breaks no rule any more")
    assert not stale, "remove from PENDING:\n" + "\n".join(stale)


def _edge_in_a_cycle(edge, edges) -> bool:
    """Whether ``a -> b`` closes a circle: ``b`` reaches ``a`` over the import graph."""
    a, b = edge
    graph: dict[str, set[str]] = defaultdict(set)
    for x, y in edges:
        graph[x].add(y)
    seen, todo = {b}, [b]
    while todo:
        v = todo.pop()
        if v == a:
            return True
        for w in graph[v] - seen:
            seen.add(w)
            todo.append(w)
    return False


def module_graph(lazy: bool) -> dict[tuple[str, str], list[str]]:
    """``{(importing module, imported module): ["module:line imports module", ...]}`` over every layerscope module,
    packages' own modules included; ``lazy`` False: only the imports that run when the importer is imported."""
    known = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in known.items():
        for target, line in _imports(module, path, known, lazy=lazy):
            if target is None:
                continue
            b = VERSION_UNIT if target == PACKAGE else target
            if b != module:
                edges[module, b].append(f"{module}:{line} imports {target}")
    return dict(edges)


def _circle_name(component: list[str]) -> str:
    return "circle " + " -> ".join(sorted(component))


def _too_long() -> dict[str, int]:
    """``{"size <module>": lines}`` for every module over MAX_LINES."""
    lines = {m: len(p.read_bytes().splitlines()) for m, p in _modules().items()}
    return {f"size {m}": n for m, n in lines.items() if n > MAX_LINES}


def test_no_import_circle_between_modules():
    """Catches: two modules importing each other when imported, inside one package too (bench.runner and
    bench.baseline_rows over a TYPE_CHECKING import), which the package-level check cannot see."""
    edges = module_graph(lazy=False)
    cycles = _cycles(edges)
    assert not cycles, "\n".join(_describe_cycle(c, edges) for c in cycles)


def test_no_import_circle_through_lazy_imports():
    """Catches: a circle closed by an import inside a function (report.writer and report.compare importing each
    other's helpers in functions): a lazy import hides a circle, it does not remove it."""
    edges = module_graph(lazy=True)
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    found = [comp for comp in _components(edges) if _circle_name(comp) not in KNOWN_EXCEPTIONS]
    cycles = [_one_cycle(sorted(comp)[0], set(comp), graph) for comp in found]
    assert not cycles, "\n".join(_describe_cycle(c, edges) for c in cycles)


def test_no_module_over_max_lines():
    """Catches: a module grown past MAX_LINES (split it by what its parts do)."""
    long = {name: n for name, n in _too_long().items() if name not in KNOWN_EXCEPTIONS}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_known_exception_is_still_needed():
    """Catches: a KNOWN_EXCEPTIONS entry whose circle or long module is gone (remove it from the list)."""
    present = {_circle_name(c) for c in _components(module_graph(lazy=True))} | set(_too_long())
    assert sorted(set(KNOWN_EXCEPTIONS) - present) == []


def test_module_level_imports_leave_out_function_bodies_only(tmp_path, monkeypatch):
    """The module-level graph keeps imports in class bodies and ``if TYPE_CHECKING`` blocks, drops those inside
    functions; the lazy graph has both, and a circle through a function is found there only."""
    pkg = tmp_path / PACKAGE / "bench"
    pkg.mkdir(parents=True)
    for f in ("__init__.py", "bench/__init__.py"):
        (tmp_path / PACKAGE / f).touch()
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from layerscope.bench import b\n"
                              "class K:\n    from layerscope.bench import c\n")
    (pkg / "b.py").write_text("def f():\n    from layerscope.bench.a import K\n")
    (pkg / "c.py").write_text("import layerscope\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert module_graph(lazy=False) == {
        ("layerscope.bench.a", "layerscope.bench.b"): ["layerscope.bench.a:3 imports layerscope.bench.b"],
        ("layerscope.bench.a", "layerscope.bench.c"): ["layerscope.bench.a:5 imports layerscope.bench.c"],
        ("layerscope.bench.c", VERSION_UNIT): ["layerscope.bench.c:1 imports layerscope"]}
    lazy = module_graph(lazy=True)
    assert lazy[("layerscope.bench.b", "layerscope.bench.a")] == ["layerscope.bench.b:2 imports layerscope.bench.a"]
    assert _cycles(module_graph(lazy=False)) == []
    assert [_circle_name(c) for c in _components(lazy)] == ["circle layerscope.bench.a -> layerscope.bench.b"]


def test_the_checks_catch_what_they_are_for():
    """The rules fire on a made-up graph: a cycle and a floor inversion are found and named."""
    edges = {("engines", "export"): ["layerscope.engines.ort:1 imports layerscope.export.cache"],
             ("export", "engines"): ["layerscope.export.validate:2 imports layerscope.engines.ort"],
             ("model", "extraction"): ["layerscope.model.x:3 imports layerscope.extraction.y"],
             ("vocab", "model"): ["layerscope.vocab.a:4 imports layerscope.model.b"]}
    cycles = _cycles(edges)
    assert [sorted(set(c)) for c in cycles] == [["engines", "export"]]
    text = _describe_cycle(cycles[0], edges)
    assert "engines -> export -> engines" in text and "layerscope.export.validate:2" in text
    bad = _floor_violations(edges)
    assert set(bad) == {("engines", "export"), ("model", "extraction"), ("vocab", "model")}
    assert _edge_in_a_cycle(("export", "engines"), edges) and not _edge_in_a_cycle(("model", "extraction"), edges)


def test_imports_inside_functions_and_relative_imports_count(tmp_path, monkeypatch):
    """The parser sees a lazy import inside a function, ``from pkg import module`` and relative imports."""
    pkg = tmp_path / PACKAGE
    (pkg / "engines").mkdir(parents=True)
    (pkg / "export").mkdir()
    for f in ("__init__.py", "engines/__init__.py", "export/__init__.py", "export/cache.py", "engines/run.py"):
        (pkg / f).touch()
    (pkg / "engines" / "ort.py").write_text(
        "def f():\n    from layerscope.export import cache\n    from . import run\n    from ..export.cache import x\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    graph = import_graph()
    assert graph == {("engines", "export"): ["layerscope.engines.ort:2 imports layerscope.export.cache",
                                             "layerscope.engines.ort:4 imports layerscope.export.cache"]}


def test_model_floor_never_loads_onnxruntime_and_no_torch_at_import():
    """Catches: onnxruntime anywhere in model/, or torch/transformers/optimum imported when model/ is imported."""
    known = _modules()
    for module, path in known.items():
        if _unit(module) != "model":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "onnxruntime" for n in names), f"{module}:{node.lineno}"
    code = ("import sys, pkgutil, importlib, layerscope.model as m\n"
            "for info in pkgutil.iter_modules(m.__path__): importlib.import_module('layerscope.model.' + info.name)\n"
            "print(sorted(x for x in ('torch', 'onnxruntime', 'transformers', 'optimum') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_subpackage_shadows_a_public_name():
    """Catches: a package or module named like a lazy public name (``layerscope/extract/``), which, once imported,
    replaces ``layerscope.extract`` the function with the module (``from layerscope import extract`` gets it)."""
    import layerscope

    children = {p.stem for p in (SRC / "layerscope").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert sorted(children & set(layerscope._LAZY)) == []
    code = ("import importlib, layerscope\n"
            "for m in set(layerscope._LAZY.values()): importlib.import_module(m)\n"
            "from layerscope import LayerStore, embed, extract\n"
            "print(type(LayerStore).__name__, type(embed).__name__, type(extract).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SRC)}).stdout.split()
    assert out == ["type", "function", "function"]
