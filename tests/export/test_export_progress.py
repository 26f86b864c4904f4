"""An export is never silent for minutes: while each long step runs (loading and tracing, the graph edits, the
parity check against PyTorch) a line says it is still running every ``LINE_EVERY_S`` seconds (30), as the lens
head's steps do. Here the interval is shortened so that the tiny models' steps last several of them."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from layerscope import progress
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision  # noqa: E402

STILL = re.compile(r"still (.+) \(\d+:\d\d:\d\d elapsed\)$")


def _still(said: list[str]) -> set[str]:
    return {m.group(1) for line in said if (m := STILL.match(line))}


@pytest.fixture
def quick_lines(monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.01)


def test_a_text_export_says_it_is_still_tracing_and_checking(tiny_model, tmp_path, quick_lines):
    said: list[str] = []
    export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "e", progress=said.append)
    doing = _still(said)
    assert {"loading and exporting with optimum", "checking every output against PyTorch"} <= doing, said
    assert doing <= {"loading and exporting with optimum", "adding raw embeddings and in-graph pooling",
                     "keeping the decoding head", "checking every output against PyTorch"}, said
    # each heartbeat falls inside its step: after the step's own line, before the next step's
    for line in said:
        m = STILL.match(line)
        if m and m.group(1).startswith("checking"):
            step = next(i for i, said_line in enumerate(said) if said_line.startswith("checking every output"))
            assert step < said.index(line)


def test_a_vision_export_says_it_is_still_tracing_and_checking(tmp_path, quick_lines):
    ckpt = build_tiny_vision("vit", tmp_path / "vit")
    said: list[str] = []
    export_model(resolve_source(str(ckpt)), tmp_path / "e", progress=said.append)
    assert {"exporting with torch.onnx", "checking every output against PyTorch"} <= _still(said), said
