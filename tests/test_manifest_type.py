"""The typed ``Manifest``: read once, round-trips, refuses what it cannot read, opens old copies."""

from __future__ import annotations

import json

import pytest

from layerscope.errors import ManifestError
from layerscope.model.manifest import read_manifest
from layerscope.model.manifest_type import FORMAT_VERSION, Manifest


def _plain(**extra):
    d = {"source": {"spec": "m", "path_or_id": "/models/m", "is_local": True, "revision": None, "alias": "mini",
                    "weights_sha256": "ab" * 32},
         "family": "bert", "kind": "encoder", "num_layers": 2, "hidden_size": 8, "max_length": 16,
         "inputs": ["input_ids", "attention_mask"], "layers": ["raw", "0", "1", "2"], "default_pooling": "mean",
         "eos_token_id": None, "pooled_output": None, "vocab_size": 30, "sentence_transformers": None}
    d.update(extra)
    return d


def _export(**extra):
    parity = {"tolerance_abs": 1e-4, "outputs": {"hidden_states.0": {"max_abs": 1e-7, "min_cos": 0.99999},
                                                 "pooled.mean": {"max_abs": 2e-7, "min_cos": 0.99998},
                                                 "raw_embeddings": {"max_abs": 0.0, "min_cos": 0.5}}}
    variants = {"int8": {"file": "model.int8.onnx", "sha256": "cd" * 32, "precision": "int8",
                         "parity": {"outputs": {"hidden_states.0": {"max_abs": 1e-2, "min_cos": 0.998}}}}}
    return _plain(format_version=FORMAT_VERSION, onnx_file="model.onnx", onnx_sha256="ef" * 32,
                  outputs={"hidden_states.0": ["batch_size", "sequence_length", 8]}, pooled_modes=["mean"],
                  pooled_layers=["raw", "0", "1", "2"], parity=parity, variants=variants,
                  tokenizer={"fast": True, "special_ids": {"pad_token_id": 0}}, some_future_key={"kept": [1, 2]},
                  **extra)


def test_fields_are_typed_and_the_json_form_round_trips():
    """Catches: a field read from the wrong key, a key lost on the way back to JSON (stores and results embed
    the dict), or a typed read that disagrees with the dict it came from."""
    d = _export()
    m = Manifest.from_dict(d)
    assert (m.num_layers, m.hidden_size, m.family, m.max_length) == (2, 8, "bert", 16)
    assert m.source.weights_sha256 == "ab" * 32 and m.source.label == "mini" and m.key == "ab" * 32
    assert m.tokenizer.fast and m.tokenizer.special_ids["pad_token_id"] == 0
    assert m.variant("int8").file == "model.int8.onnx" and m.variant("int8").precision == "int8"
    assert m.min_cosine("fp32") == 0.99998  # raw_embeddings is not a layer or pooled output
    assert m.min_cosine("int8") == 0.998 and m.min_cosine("ov-fp32") is None
    assert m.pooled_layers == ("raw", "0", "1", "2") and m.is_export
    back = m.to_dict()
    assert back == d and back["some_future_key"] == {"kept": [1, 2]}
    assert Manifest.from_dict(json.loads(json.dumps(back))) == m
    back["num_layers"] = 99  # the copy handed out is the caller's: the manifest stays as read
    assert m.num_layers == 2 and m.to_dict()["num_layers"] == 2


def test_an_export_manifest_round_trips_through_its_file(bert_export):
    m = read_manifest(bert_export)
    on_disk = json.loads((bert_export / "manifest.json").read_text())
    assert isinstance(m, Manifest) and m.to_dict() == on_disk
    assert m.num_layers == on_disk["num_layers"] and list(m.outputs) == list(on_disk["outputs"])
    assert m.parity.outputs["hidden_states.0"].min_cos == on_disk["parity"]["outputs"]["hidden_states.0"]["min_cos"]


@pytest.mark.parametrize("version,said", [(None, "has no format_version"), (99, "format_version 99")])
def test_a_missing_or_unknown_format_version_is_one_line_saying_how_to_upgrade(tmp_path, version, said):
    """Catches: a manifest.json of another layout read as if it were this one (fields silently wrong)."""
    d = _export()
    if version is None:
        del d["format_version"]
    else:
        d["format_version"] = version
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError) as err:
        read_manifest(tmp_path)
    line = str(err.value)
    assert said in line and "layerscope export MODEL --out NEW_DIR" in line and "\n" not in line
    if version is not None:  # an embedded copy of an unknown layout is refused the same way
        with pytest.raises(ManifestError, match="format_version 99"):
            Manifest.from_dict(d)


def test_a_manifest_without_required_facts_is_one_line():
    d = _plain()
    del d["num_layers"]
    with pytest.raises(ManifestError, match="lacks num_layers"):
        Manifest.from_dict(d)
    with pytest.raises(ManifestError, match="wrong type"):
        Manifest.from_dict(_plain(hidden_size="wide"))
    bad = _plain()
    bad["source"]["weights_sha256"] = "../../elsewhere"  # result folders are named from it
    with pytest.raises(ManifestError, match="not a sha256 hex digest"):
        Manifest.from_dict(bad)


def test_an_old_copy_without_a_version_still_opens_from_a_store(tmp_path):
    """Catches: a store written before manifests had a format version (or typed fields) that no longer opens."""
    from layerscope.store.store import LayerStore

    old = _plain()  # as describe_model wrote it before, with no format_version key at all
    del old["layers"], old["sentence_transformers"]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "texts.jsonl").write_text('{"id": "0", "text": "a"}\n{"id": "1", "text": "b"}\n')
    from layerscope.store.store_spec import StoreSpec

    store = LayerStore.create(tmp_path / "s", n=2, spec=StoreSpec.bare(["0"], ["mean"]), hidden_size=8, manifest=old)
    store.close()
    m = LayerStore.open(tmp_path / "s", allow_incomplete=True).manifest
    assert isinstance(m, Manifest) and m.format_version is None and not m.is_export
    assert (m.num_layers, m.hidden_size, m.source.label) == (2, 8, "mini")
    assert m.to_dict() == old
