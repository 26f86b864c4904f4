"""A model whose weights hold NaN gives one clear line naming the first bad layer, from every engine and
every caller (extract, embed, an analysis); nothing non-finite is stored and no analysis reports a tie."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from cli_helpers import run_cli as cli
from layerscope.errors import InputError
from layerscope.extraction.pipeline import embed, extract

TEXTS = ["the cat sat on the mat", "a dog runs in the park", "two birds fly", "she reads a book"]


@pytest.fixture()
def nan_bert(tiny_model, tmp_path):
    """The tiny BERT with its second encoder layer's output weights set to NaN: layers raw, 0 and 1 are
    finite, layer 2 onwards is NaN."""
    from safetensors.numpy import load_file, save_file

    src = tiny_model("bert")
    out = tmp_path / "nan-bert"
    shutil.copytree(src, out)
    weights = load_file(str(out / "model.safetensors"))
    key = "bert.encoder.layer.1.output.dense.weight"
    weights[key] = np.full_like(weights[key], np.nan)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def test_extract_torch_refuses_nan_vectors_naming_the_layer(nan_bert, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "store"
    code, text = cli(["extract", "--model", nan_bert, "--engine", "torch", "--input", corpus, "--out", out,
                      "--pooling", "mean"], capsys)
    flat = " ".join(text.split())
    assert code == 2, text
    assert "non-finite vectors (NaN or inf) at layer 2 (mean pooling" in flat, text
    assert "Traceback" not in text and "internal error" not in text
    assert not out.exists()  # no row was stored, so nothing is left behind


def test_layers_before_the_broken_one_still_extract(nan_bert, tmp_path):
    got = extract(nan_bert, TEXTS, tmp_path / "ok", engine="torch", layers="raw,0,1", poolings=["mean"])
    assert np.isfinite(got.store["mean", "1"]).all()


def test_analysis_on_a_nan_model_is_an_error_not_a_tie(nan_bert, tmp_path, capsys):
    code, text = cli(["run", "compositionality", "--model", nan_bert, "--engine", "torch", "--pooling", "mean",
                      "--out", tmp_path / "r"], capsys)
    assert code == 2, text
    assert "non-finite vectors" in text and "layer 2" in text, text
    assert "win rate" not in text


def _poisoned_ort(bert_export, layer_pos: int, row: int):
    """The real ONNX Runtime engine, with one text of one layer turned to inf in what it hands back."""
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    eng = create_engine("ort", ModelHandle.resolve(bert_export))
    real = eng.run

    def run(batch, layers, poolings):
        out = real(batch, layers, poolings)
        hit = np.nonzero(np.asarray(batch.index) == row)[0]
        for arr in out.values():
            arr[layer_pos, hit, 0] = np.inf
        return out

    eng.run = run
    return eng


def test_ort_engine_output_is_checked_too(bert_export, tmp_path):
    eng = _poisoned_ort(bert_export, 3, row=2)
    with pytest.raises(InputError, match=r"at layer 2 \(mean pooling, row 2\)"):
        extract(bert_export, TEXTS, tmp_path / "s", engine=eng, poolings=["mean"])
    with pytest.raises(InputError, match=r"at layer 2 \(cls pooling, row 2\)"):
        embed(bert_export, TEXTS, engine=_poisoned_ort(bert_export, 3, row=2), poolings=["cls"])
    assert not (tmp_path / "s").exists()
