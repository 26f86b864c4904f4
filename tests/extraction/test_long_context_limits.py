"""Long-context models: the engine profile comes from --max-length (else the model's limit), and inspect run
takes the limits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.extraction import pipeline


@pytest.fixture(scope="module")
def qwen_export(tiny_export):
    return tiny_export("qwen2", pooled=["mean"])


@pytest.mark.parametrize("max_length", [None, 24])
def test_engine_profile_follows_max_length_not_the_corpus(qwen_export, tmp_path, monkeypatch, max_length):
    seen = {}
    real = pipeline.open_engine

    def spy(handle, name, **options):
        seen.update(options)
        return real(handle, name, **options)

    monkeypatch.setattr(pipeline, "open_engine", spy)
    texts = ["a cat sat on the mat", "hi", "the quick brown fox jumps"]
    report = pipeline.extract(qwen_export, texts, tmp_path / "store", engine="ort", layers="all", poolings=["mean"],
                              max_length=max_length)
    lengths = np.load(tmp_path / "store" / "lengths.npy")
    manifest = json.loads((qwen_export / "manifest.json").read_text())
    # the same profile whatever the corpus holds (and whichever executor runs it): --max-length, else the limit
    assert seen["max_seq"] == (max_length or manifest["max_length"]) > int(lengths.max())
    assert report.store.n == 3
    meta = json.loads((tmp_path / "store" / "store.json").read_text())
    assert meta["engine"]["engine"] == "ort" and meta["settings"]["batch_tokens"] > 0


def test_failed_engine_leaves_no_store(qwen_export, tmp_path, monkeypatch):
    from layerscope.errors import EngineUnavailableError

    def broken(handle, name, **options):
        raise EngineUnavailableError("no such engine here")

    monkeypatch.setattr(pipeline, "open_engine", broken)
    with pytest.raises(EngineUnavailableError):
        pipeline.extract(qwen_export, ["hi"], tmp_path / "store", engine="ort")
    assert not (tmp_path / "store").exists()


def test_run_accepts_max_length_and_batch_tokens(qwen_export, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from layerscope.cli import app

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "res"
    r = CliRunner().invoke(app, ["run", "similarity", "--model", str(qwen_export), "--engine", "ort",
                                 "--max-length", "6", "--batch-tokens", "64", "--out", str(out)])
    assert r.exit_code == 0, r.output
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["max_length"] == 6 and settings["batch_tokens"] == 64
    stores = list((tmp_path / "cache").rglob("store.json"))
    assert stores and all(json.loads(p.read_text())["settings"]["max_length"] == 6 for p in stores)
