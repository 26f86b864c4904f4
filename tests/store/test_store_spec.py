"""``StoreSpec``: store.json's settings, typed; a store written in the first format still opens and resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fake_engine
from layerscope.errors import StoreError

TEXTS = ["the cat sat", "a dog ran far", "birds fly over the river", "one more"]


@pytest.fixture(autouse=True)
def fake():
    fake_engine.register_fake()
    yield
    fake_engine.unregister_fake()


@pytest.fixture
def old_store(tiny_model, tmp_path):
    """A store whose store.json is in format 1, as layerscope wrote it before settings were typed: no corpus
    hash, prompt, variant or tokens in its settings, and no structure hash."""
    from layerscope.extraction.pipeline import extract

    model = str(tiny_model("bert"))
    out = tmp_path / "old"
    extract(model, TEXTS, out, engine="fake", layers="0,1", poolings=["mean"])
    meta = json.loads((out / "store.json").read_text(encoding="utf-8"))
    key = meta["settings"]["model_key"]
    meta["format_version"] = 1
    meta.pop("structure_sha256")
    meta["settings"] = {"model": model, "model_key": key, "engine_requested": "fake", "layers": ["0", "1"],
                        "poolings": ["mean"], "dtype": "float32", "batch_tokens": 8192, "max_batch": 64,
                        "max_length": 128, "input": "<4 texts in memory>", "layerscope_version": "0.3.0"}
    (out / "store.json").write_text(json.dumps(meta), encoding="utf-8")
    return model, out


def test_a_format_1_store_opens_with_its_settings_typed(old_store):
    from layerscope.store.store import LayerStore

    _, out = old_store
    store = LayerStore.open(out)
    spec = store.spec
    assert (spec.layers, spec.poolings, spec.max_length, spec.engine) == (("0", "1"), ("mean",), 128, "fake")
    assert spec.corpus_sha256 is None and spec.prompt is None and spec.variant is None and spec.tokens is None
    assert store["mean", 1].shape == (4, store.hidden_size)


def test_a_format_1_store_resumes_with_the_same_request_and_refuses_another(old_store):
    from layerscope.extraction.pipeline import extract
    from layerscope.store.store import LayerStore

    model, out = old_store
    before = np.array(LayerStore.open(out)["mean", 1])
    report = extract(model, TEXTS, out, engine="fake", layers="0,1", poolings=["mean"], resume=True)
    assert report.store.complete and np.array_equal(report.store["mean", 1], before)
    with pytest.raises(StoreError, match=r"was made with layers=\['0', '1'\], this run asks for \['1'\]"):
        extract(model, TEXTS, out, engine="fake", layers="1", poolings=["mean"], resume=True)


@pytest.mark.parametrize("version", [0, 3, None])
def test_an_unknown_store_format_is_one_line(old_store, version):
    from layerscope.store.store import LayerStore

    _, out = old_store
    meta = json.loads((out / "store.json").read_text(encoding="utf-8"))
    meta["format_version"] = version
    (out / "store.json").write_text(json.dumps(meta), encoding="utf-8")
    with pytest.raises(StoreError, match=f"has store format {version}, this layerscope reads 1, 2"):
        LayerStore.open(out)


def test_a_new_store_writes_its_settings_once_and_finishing_leaves_them(tiny_model, tmp_path, monkeypatch):
    """Settings are the spec made before the store was: every later write of store.json carries them unchanged."""
    from layerscope.store import store as store_mod
    from layerscope.extraction.pipeline import extract

    written = []
    real = store_mod.write_json_atomic

    def spy(path, data, *a, **kw):
        if path.name == "store.json":
            written.append(json.loads(json.dumps(data["settings"])))
        return real(path, data, *a, **kw)

    monkeypatch.setattr(store_mod, "write_json_atomic", spy)
    report = extract(str(tiny_model("bert")), TEXTS, tmp_path / "s", engine="fake", layers="0,1", poolings=["mean"],
                     prompt="query: ")
    assert len(written) >= 3 and all(s == written[0] for s in written)  # made, updated, finished
    assert written[0]["prompt"] == "query: " and written[0]["batch_tokens"] == 8192  # the fake engine's budget
    assert written[0]["corpus_sha256"] and report.store.spec.to_json() == written[0]
