"""One extraction looks its engine up in the registry once: ``prepare`` resolves ``--engine`` into an
``EngineChoice`` and everything below it (the model's resolution, the engine's start, the options' checks)
reads that choice. Counted by wrapping the registry's one name look-up, ``engine_spec``, on the command an
ONNX engine runs (its start checked, its export found); ``--shard`` and the Ray driver are counted beside the
engine options they open with (tests/extraction/test_ray_extract.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def lookups(monkeypatch):
    """The names ``engine_spec`` was asked for, in order."""
    from layerscope.engines import registry

    asked: list[str] = []
    real = registry.engine_spec

    def counting(name):
        asked.append(name)
        return real(name)

    monkeypatch.setattr(registry, "engine_spec", counting)
    return asked


def test_one_cli_extract_looks_the_engine_up_once(bert_export, tmp_path, lookups):
    from layerscope.cli import main

    (tmp_path / "c.txt").write_text("".join(f"text {i} word\n" for i in range(12)), encoding="utf-8")
    try:
        main(["extract", "-m", str(bert_export), "-i", str(tmp_path / "c.txt"), "-o", str(tmp_path / "s"),
              "--engine", "ort", "--layers", "0,1", "--threads", "1"])
    except SystemExit as exc:
        assert not exc.code
    assert (tmp_path / "s" / "store.json").exists()
    assert lookups == ["ort"]

