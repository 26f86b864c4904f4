"""``StoreRecord``: store.json read once, typed and checked; a field of the wrong type is one line naming it."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

import fake_engine
from cli_helpers import cli_output
from layerscope.errors import StoreError

TEXTS = ["the cat sat", "a dog ran far", "birds fly over the river", "one more"]


@pytest.fixture(autouse=True)
def fake():
    fake_engine.register_fake()
    yield
    fake_engine.unregister_fake()


@pytest.fixture(scope="module")
def made(tiny_model, tmp_path_factory):
    from layerscope.extraction.pipeline import extract

    fake_engine.register_fake()
    try:
        out = tmp_path_factory.mktemp("record") / "s"
        extract(str(tiny_model("bert")), TEXTS, out, engine="fake", layers="0,1", poolings=["mean"])
    finally:
        fake_engine.unregister_fake()
    return out


@pytest.fixture
def store(made, tmp_path):
    path = tmp_path / "s"
    shutil.copytree(made, path)
    return path


def _edit(path, fn) -> None:
    doc = json.loads((path / "store.json").read_text(encoding="utf-8"))
    fn(doc)
    (path / "store.json").write_text(json.dumps(doc), encoding="utf-8")


def _set(key, value):
    return lambda doc: doc.__setitem__(key, value)


def _set_checksum_bytes(doc) -> None:
    doc["checksums"]["texts.jsonl"]["bytes"] = "big"


@pytest.mark.parametrize("edit, field", [
    (_set("texts_bytes", "many"), "texts_bytes"),
    (_set("empty_texts", "none"), "empty_texts"),
    (_set("n", "4"), "its n is"),
    (_set("layers", "0,1"), "its layers is"),
    (_set("dtype", "float64"), "its dtype is"),
    (_set("half_error", {"mean/1": 0.5}), "half_error"),
    (_set_checksum_bytes, "checksums"),
    (lambda doc: doc["settings"].pop("model_key"), "model_key"),
])
def test_a_field_of_the_wrong_type_is_one_line_naming_it(store, edit, field, capsys):
    """Caught on open, before an array is read, and by verify: never a KeyError/ValueError traceback later."""
    from layerscope.store.store import LayerStore

    _edit(store, edit)
    with pytest.raises(StoreError) as exc:
        LayerStore.open(store)
    line = str(exc.value)
    assert "\n" not in line and field in line and "store.json" in line, line
    code, out, err = cli_output(["verify", store], capsys)
    assert code == 2 and "Traceback" not in err and field in " ".join(err.split()), err


def test_the_structure_hash_is_the_one_stores_were_made_with(store):
    """A store made before the record existed must still open: its recorded hash is taken over the same fields,
    computed here by hand from the file as written."""
    from layerscope.store.store import LayerStore

    doc = json.loads((store / "store.json").read_text(encoding="utf-8"))
    fields = {k: doc[k] for k in ("format_version", "n", "layers", "poolings", "hidden_size", "dtype", "manifest")}
    fields["corpus_sha256"] = doc["settings"]["corpus_sha256"]
    blob = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert doc["structure_sha256"] == hashlib.sha256(blob.encode("utf-8")).hexdigest()
    assert LayerStore.open(store).record.structure_hash() == doc["structure_sha256"]


def test_what_the_record_does_not_type_is_written_back_unchanged(store):
    """A field this version does not read (a run's timings, one a newer version adds) survives every rewrite."""
    from layerscope.store.store import LayerStore

    _edit(store, _set("written_by_a_newer_layerscope", {"keep": [1, 2]}))
    before = json.loads((store / "store.json").read_text(encoding="utf-8"))
    opened = LayerStore.open(store)
    opened.update(id_field="key")
    after = json.loads((store / "store.json").read_text(encoding="utf-8"))
    assert after["written_by_a_newer_layerscope"] == {"keep": [1, 2]}
    assert after["seconds"] == before["seconds"] and after["run_rows"] == before["run_rows"] == len(TEXTS)
    assert after["settings"] == before["settings"] and after["checksums"] == before["checksums"]
    assert after["id_field"] == "key" and LayerStore.open(store).record.id_field == "key"
