"""export_model takes the model already resolved, and exports exactly that source."""

from __future__ import annotations

import pytest

from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source


def test_export_model_exports_the_resolved_source_without_resolving_again(tiny_model, tmp_path, monkeypatch):
    """Catches: export_model taking a name and resolving it again (once to describe the model, once to load
    it), so that a caller's resolved source (the export cache's handle, the CLI's --revision) is not what
    is exported; and a plain string accepted where a resolved source is meant."""
    from layerscope.model import describe, source

    resolved = resolve_source(str(tiny_model("bert")))

    def resolved_again(*args, **kwargs):
        raise AssertionError(f"resolve_source called again with {args}")

    monkeypatch.setattr(source, "resolve_source", resolved_again)
    monkeypatch.setattr(describe, "resolve_source", resolved_again)
    manifest = export_model(resolved, tmp_path / "export", pooled=["mean"])
    assert manifest.source.path_or_id == resolved.path_or_id and manifest.source.spec == resolved.spec
    with pytest.raises(TypeError, match="resolved ModelSource"):
        export_model(str(tiny_model("bert")), tmp_path / "other")
    assert not (tmp_path / "other").exists()
