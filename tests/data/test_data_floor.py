"""data/ is a floor of its own: its readers import nothing of layerscope but errors and other data modules,
not even lazily inside a function, so extraction, analyses and the bench can all read through it."""

from __future__ import annotations

import ast
from pathlib import Path

import layerscope.data

ALLOWED = ("layerscope.errors", "layerscope.data")


def _layerscope_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n == "layerscope" or n.startswith("layerscope.")]
    return found


def test_data_modules_import_only_errors_and_data():
    root = Path(layerscope.data.__file__).parent
    modules = sorted(root.glob("*.py"))
    assert len(modules) >= 10  # the corpus readers by format, pairs, items, aligned, hf_dataset, ...
    wrong = [f"{p.name}:{line} imports {name}" for p in modules for line, name in _layerscope_imports(p)
             if not any(name == a or name.startswith(a + ".") for a in ALLOWED)]
    assert not wrong, wrong
