"""A plain model whose export is cached already is run without importing transformers or torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_S  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")

# runs the CLI as a user does, then says which heavy packages the process imported
_CHILD = """
import json, sys
from layerscope.cli import main
sys.argv = ["layerscope", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("MODULES " + json.dumps({"code": code, "torch": "torch" in sys.modules,
                               "transformers": "transformers" in sys.modules}))
"""


def _extract_in_child(args: list[str], home: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": SRC, "LAYERSCOPE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], env=env, capture_output=True,
                          text=True, timeout=HANG_S)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("MODULES ")), None)
    assert line is not None, done.stdout + done.stderr
    return json.loads(line[len("MODULES "):])


@pytest.fixture()
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_cached_export_is_found_and_extracted_without_transformers_or_torch(tiny_model, tmp_path, home):
    from layerscope.export.cache import find_cached_export
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    model = tiny_model("bert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat\na dog ran home\n")
    assert find_cached_export(str(model)) is None  # nothing cached yet: the full resolution runs

    made = ensure_export(ModelHandle.resolve(model))  # the first run's export, into the cache
    found = find_cached_export(str(model))
    assert found is not None and found.export_dir == made.export_dir
    assert found.spec == str(model)  # runs and stores keep the name the user gave

    for engine in ("ort", "auto"):
        seen = _extract_in_child(["extract", "--model", str(model), "--engine", engine, "--input", str(corpus),
                                  "--out", str(tmp_path / f"store-{engine}")], home)
        assert seen == {"code": 0, "torch": False, "transformers": False}, engine
    from layerscope.store.store import LayerStore

    store = LayerStore.open(tmp_path / "store-ort")
    assert store.spec.model == str(model)
    assert len(store["mean", "2"]) == 2


def test_an_uncached_or_torch_run_still_resolves_the_model_in_full(tiny_model, tmp_path, home):
    from layerscope.export.open import resolve_model

    model = tiny_model("bert")
    assert not resolve_model(str(model), engine="ort").is_export  # no export yet: described from its files
    from layerscope.export.open import ensure_export

    ensure_export(resolve_model(str(model)))
    assert resolve_model(str(model), engine="ort").is_export
    assert not resolve_model(str(model), engine="torch").is_export  # torch runs the weights, not the export
    assert not resolve_model(str(model)).is_export  # no engine named: the model as it is
