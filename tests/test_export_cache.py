"""The export cache is keyed by content: changed weights give a new export, never the old figures."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import layerscope
from tiny_models import build_tiny_model

PAIRS = [
    ("the cat sat on the mat", "a cat is sitting on a mat", 4.6),
    ("a man plays the guitar", "a man is playing a guitar", 4.8),
    ("the dog runs in the park", "a woman reads a book", 0.2),
    ("children play football", "kids are playing soccer", 4.0),
    ("the sun is bright today", "it is raining heavily", 0.8),
    ("she cooks dinner at home", "a woman is cooking food", 3.5),
    ("two birds fly over the lake", "birds are flying above water", 3.9),
    ("the train leaves at noon", "the bus arrives at night", 1.1),
]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


@pytest.fixture()
def model_dir(tmp_path) -> Path:
    return build_tiny_model("bert", tmp_path / "mymodel", seed=0)


def _outputs(handle, texts):
    from layerscope.extraction.pipeline import embed

    return embed(handle, texts, engine="ort", layers="all", poolings=["mean"])


def _final_sts_spearman(model, tmp_path, name, engine, pairs_file):
    from layerscope.analyses.base import RunRequest, run_analysis

    ctx = RunRequest(models=[str(model)], engine=engine, layers="all", out=tmp_path / name, seed=0,
                     options={"n_boot": 20}, data=str(pairs_file), poolings=["mean"])
    _, res = run_analysis("sts", ctx)
    rows = next(iter(res["per_model"].values()))["tables"]["layers"]
    return {r["layer"]: r["spearman"] for r in rows if r["pooling"] == "mean"}, res


def test_changed_weights_give_a_new_export_and_new_figures(model_dir, tmp_path):
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"g\tf\t2020\t{i:04d}\t{s}\t{a}\t{b}\n" for i, (a, b, s) in enumerate(PAIRS)))
    texts = [a for a, _, _ in PAIRS]
    first = ensure_export(ModelHandle.resolve(model_dir))
    before = _outputs(first, texts)
    old_figures, _ = _final_sts_spearman(model_dir, tmp_path, "old", "ort", pairs)

    build_tiny_model("bert", model_dir, seed=1)  # the user retrains: new safetensors in the same dir
    second = ensure_export(ModelHandle.resolve(model_dir))
    assert second.export_dir != first.export_dir
    assert second.manifest.export_cache["key"] != first.manifest.export_cache["key"]
    assert second.manifest.source.weights_sha256 == hashlib.sha256(
        (model_dir / "model.safetensors").read_bytes()).hexdigest()
    after = _outputs(second, texts)
    assert not np.allclose(after["mean", "2"], before["mean", "2"])
    # what the analysis reports through ONNX Runtime is the new model's figures, as torch computes them
    new_ort, res = _final_sts_spearman(model_dir, tmp_path, "new-ort", "ort", pairs)
    new_torch, _ = _final_sts_spearman(model_dir, tmp_path, "new-torch", "torch", pairs)
    assert new_ort == pytest.approx(new_torch, abs=1e-6)
    assert new_ort != pytest.approx(old_figures, abs=1e-6)
    ran = next(iter(res["models"].values()))["export"]  # results.json says which export ran
    assert Path(ran["dir"]) == second.export_dir
    assert ran["onnx_sha256"] == second.manifest.onnx_sha256
    assert ran["cache_key"] == second.manifest.export_cache["key"]
    assert ran["made_by"] == layerscope.__version__
    # the old entry stays as it was and is not handed out for the new weights again
    assert (first.export_dir / "manifest.json").exists()
    assert ensure_export(ModelHandle.resolve(model_dir)).export_dir == second.export_dir


def test_key_covers_options_versions_and_an_entry_with_another_key_is_not_reused(model_dir, monkeypatch):
    from layerscope.export import cache
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(model_dir)
    base = cache.export_key(handle)
    assert base["key"] == cache.export_key(handle, {"opset": 18, "atol": 1e-4})["key"]  # defaults filled in
    assert base["key"] != cache.export_key(handle, {"pooled": ["mean"]})["key"]
    assert base["key"] != cache.export_key(handle, {"opset": 17})["key"]
    assert set(base["versions"]) >= {"layerscope", "optimum", "onnx", "onnxruntime", "torch", "transformers"}
    (model_dir / "README.md").write_text("a model card edit changes no export")
    assert cache.export_key(ModelHandle.resolve(model_dir))["key"] == base["key"]
    original = (model_dir / "tokenizer_config.json").read_bytes()
    cfg = json.loads(original)
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": 64}))
    changed_tokenizer = cache.export_key(ModelHandle.resolve(model_dir))["key"]
    assert changed_tokenizer != base["key"]  # same weights, other tokenizer settings: another export
    (model_dir / "tokenizer_config.json").write_bytes(original)
    with monkeypatch.context() as m:  # another virtual environment sharing the cache
        m.setattr(cache, "tool_versions", lambda: {**base["versions"], "onnxruntime": "0.0-other-venv"})
        assert cache.export_key(handle)["key"] != base["key"]
    with monkeypatch.context() as m:  # layerscope's additions to the graph changed within one version
        m.setattr(cache, "GRAPH_RECIPE", cache.GRAPH_RECIPE + 1)
        assert cache.export_key(handle)["key"] != base["key"]

    made = ensure_export(handle)
    # an entry whose manifest says another key (e.g. written by another version) is exported again
    manifest = json.loads((made.export_dir / "manifest.json").read_text())
    manifest["export_cache"]["key"] = "0" * 64
    (made.export_dir / "manifest.json").write_text(json.dumps(manifest))
    again = ensure_export(ModelHandle.resolve(model_dir))
    assert again.export_dir == made.export_dir
    assert again.manifest.export_cache["key"] == base["key"]


def test_hash_is_remembered_by_stat_signature_and_a_rewrite_is_seen(tmp_path, monkeypatch):
    from layerscope.model import identity

    f = tmp_path / "w.safetensors"
    f.write_bytes(b"a" * 1000)
    assert identity.hash_files([f]) == hashlib.sha256(b"a" * 1000).hexdigest()
    assert not list((tmp_path / "home" / "hashes").glob("*.json"))  # just written: racy, not remembered
    monkeypatch.setattr(identity, "RACY_SECONDS", -1.0)
    identity.hash_files([f])
    assert len(list((tmp_path / "home" / "hashes").glob("*.json"))) == 1
    # a rewrite of the same size is a new signature (ctime and mtime move), so it is hashed again
    f.write_bytes(b"b" * 1000)
    assert identity.hash_files([f]) == hashlib.sha256(b"b" * 1000).hexdigest()


def test_a_second_caller_waits_for_the_first_export_and_reuses_it(model_dir, tmp_path, monkeypatch):
    """Two concurrent callers (threads here; the file lock works the same across processes): one export."""
    import threading

    from layerscope.export import exporter
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    calls = []
    real = exporter.export_model

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(exporter, "export_model", counting)
    got, errors = [], []

    def worker():
        try:
            got.append(ensure_export(ModelHandle.resolve(model_dir)).export_dir)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors and len(got) == 2 and got[0] == got[1]
    assert len(calls) == 1
    entries = [p.name for p in (tmp_path / "home" / "exports").iterdir() if not p.name.endswith(".lock")]
    assert entries == [got[0].name]  # one entry, no staging dir left


def test_a_hub_model_is_keyed_by_its_cached_snapshot(tmp_path, monkeypatch):
    """A hub id's identity is the commit its 'main' points at in the local HF cache, plus its files."""
    from huggingface_hub import constants

    from layerscope.model.identity import model_identity
    from layerscope.model.source import ModelSource

    repo = tmp_path / "hub" / "models--org--tiny"
    for commit, weights in (("a" * 40, b"old"), ("b" * 40, b"new")):
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        (snap / "model.safetensors").write_bytes(weights)
    (repo / "refs").mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    source = ModelSource("org/tiny", "org/tiny", False)
    (repo / "refs" / "main").write_text("a" * 40)
    old = model_identity(source)
    (repo / "refs" / "main").write_text("b" * 40)  # the hub's main moved on and was downloaded
    new = model_identity(source)
    assert old["commit"] == "a" * 40 and new["commit"] == "b" * 40
    assert new["weights_sha256"] == hashlib.sha256(b"new").hexdigest() != old["weights_sha256"]
    assert model_identity(ModelSource("org/absent", "org/absent", False))["commit"] is None


def test_moved_weights_reuse_the_entry_and_it_records_where_they_are_now(model_dir, tmp_path):
    """Content keys let a moved checkpoint reuse its export; what reloads the weights (a variant's parity,
    the bench's reference rows) must then read them from the new place, not the vanished one."""
    import shutil

    from layerscope.errors import ModelNotFoundError
    from layerscope.export.open import ensure_export
    from layerscope.export.variants import make_variant
    from layerscope.model.families import FAMILIES
    from layerscope.model.handle import ModelHandle
    from layerscope.model.source import load_torch_model

    first = ensure_export(ModelHandle.resolve(model_dir))
    old_source = first.manifest.source.model_source()
    moved = tmp_path / "elsewhere" / model_dir.name  # an entry's name is the folder's: same name, new place
    moved.parent.mkdir()
    shutil.move(str(model_dir), moved)
    with pytest.raises(ModelNotFoundError, match="no longer exists") as err:
        load_torch_model(old_source, FAMILIES["bert"])
    assert str(model_dir) in str(err.value)

    again = ensure_export(ModelHandle.resolve(moved))
    assert again.export_dir == first.export_dir  # same weights, same entry
    assert again.manifest.source.path_or_id == str(moved.resolve())
    assert again.manifest.onnx_sha256 == first.manifest.onnx_sha256
    entry = make_variant(again.export_dir, "int8")  # reloads the torch weights for its parity check
    assert entry["parity"]["outputs"]
    from layerscope.model.manifest import verify_export, read_manifest

    verify_export(again.export_dir, read_manifest(again.export_dir))
