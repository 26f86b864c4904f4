"""Layer specs are parsed by one function (vocab/layers.py), once per model on the way to an analysis."""

from __future__ import annotations

import pytest

from layerscope.errors import InputError
from layerscope.vocab import layers as vocab_layers
from layerscope.vocab.layers import Layers, layer_names, resolve_layers


def test_specs_resolve_to_canonical_names():
    assert layer_names(3) == ["raw", "0", "1", "2", "3"]
    assert resolve_layers("all", 3) == ["raw", "0", "1", "2", "3"]
    assert resolve_layers("raw,0,3,-1", 3) == ["raw", "0", "3"]  # -1 is 3: no repeat
    assert resolve_layers("2:", 3) == ["2", "3"]
    assert resolve_layers(":1,last", 3) == ["0", "1", "3"]
    assert resolve_layers([-2, "raw"], 3) == ["2", "raw"]
    with pytest.raises(InputError, match="out of range"):
        resolve_layers("4", 3)
    with pytest.raises(InputError, match="not available"):
        resolve_layers("raw", 3, with_raw=False)


def test_resolved_layers_pass_through_unparsed(monkeypatch):
    calls = []
    real = vocab_layers._parse
    monkeypatch.setattr(vocab_layers, "_parse", lambda *a: calls.append(a) or real(*a))
    first = resolve_layers("0,-1", 4)
    assert isinstance(first, Layers) and first == ["0", "4"] and len(calls) == 1
    assert resolve_layers(first, 4) is first and len(calls) == 1
    # another model, or a caller that refuses raw, parses again (and says what is wrong)
    assert resolve_layers(first, 6) == ["0", "4"] and len(calls) == 2
    with pytest.raises(InputError, match="not available"):
        resolve_layers(resolve_layers("raw", 4), 4, with_raw=False)


@pytest.mark.parametrize("cache", [False, True], ids=["in-memory", "cached-store"])
def test_an_analysis_run_parses_layers_once_per_model(tiny_model, tmp_path, monkeypatch, cache):
    """run_analysis resolves --layers and hands the names on: the analysis, the vector cache and the
    extraction below it do not parse the spec again (before: three parses per model)."""
    from layerscope.analyses.base import RunRequest, run_analysis

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    data = tmp_path / "pairs.tsv"
    pairs = [("a cat sat", "a cat sits", 4.5), ("the dog ran", "a car stops", 0.5), ("we eat", "they eat", 3.0),
             ("red sky", "blue sea", 1.0)]
    data.write_text("".join(f"g\tf\t2020\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(pairs)))
    calls = []
    real = vocab_layers._parse
    monkeypatch.setattr(vocab_layers, "_parse", lambda *a: calls.append(a[0]) or real(*a))
    ctx = RunRequest(models=[str(tiny_model("bert"))], engine="torch", layers="0,-1", out=tmp_path / "sts",
                     data=str(data), options={"n_boot": 0}, cache=cache, poolings=["mean"])
    _, res = run_analysis("sts", ctx)
    rows = next(iter(res["per_model"].values()))["tables"]["layers"]
    assert sorted({r["layer"] for r in rows}) == ["0", "2"]  # the tiny bert has 2 layers: -1 is 2
    assert calls == ["0,-1"]


def test_vocab_stays_on_its_floor():
    """vocab/ imports only layerscope.errors (not even lazily), and importing it loads no numpy, torch or onnx."""
    import ast
    import subprocess
    import sys
    from pathlib import Path

    import layerscope.vocab

    for path in Path(layerscope.vocab.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("layerscope") or name == "layerscope.errors", (path.name, name)
    code = ("import sys, layerscope.vocab.layers, layerscope.vocab.pooling, layerscope.vocab.outputs; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'torch', 'onnx', 'onnxruntime'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
