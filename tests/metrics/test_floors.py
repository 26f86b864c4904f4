"""metrics/ sits on floor 1 (numpy/scipy and layerscope.errors only); index/ never imports an analysis."""

from __future__ import annotations

import ast
from pathlib import Path

import layerscope

PKG = Path(layerscope.__file__).parent


def _layerscope_imports(path: Path) -> set[str]:
    """Every layerscope module a file imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("layerscope"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("layerscope"))
    return out


def test_metrics_import_only_errors_and_themselves():
    files = sorted((PKG / "metrics").glob("*.py"))
    assert len(files) >= 9
    for f in files:
        bad = {m for m in _layerscope_imports(f) if not m.startswith(("layerscope.metrics", "layerscope.errors"))}
        assert not bad, f"{f.name} imports {bad}"


def test_index_does_not_import_analyses_or_higher_floors():
    files = sorted((PKG / "index").glob("*.py"))
    assert any(f.name == "bench.py" for f in files)
    for f in files:
        bad = {m for m in _layerscope_imports(f)
               if m.startswith(("layerscope.analyses", "layerscope.bench", "layerscope.report", "layerscope.cli",
                                "layerscope.session", "layerscope.decoding"))}
        assert not bad, f"{f.name} imports {bad}"
