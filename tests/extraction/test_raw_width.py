"""A model whose word embeddings are narrower than its hidden states (ALBERT: ``embedding_size`` 16, hidden 32 in
the tiny zoo): ``raw`` is stored on its own at its width, ``all`` is layers 0..L, and a run asking ``raw`` with
other layers is refused in one line before any engine starts; the vectors are a plain Hugging Face forward's."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought 3 apples and 12 oranges"]


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
    import tiny_zoo

    return tiny_zoo.build_zoo_model("albert", tmp_path_factory.mktemp("albert"), seed=5)


@pytest.fixture(scope="module")
def albert_export(albert, tmp_path_factory):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    out = tmp_path_factory.mktemp("albert-export") / "onnx"
    export_model(resolve_source(str(albert)), out)
    return out


@pytest.fixture(scope="module")
def hf(albert):
    """Mean over each text's tokens, by Hugging Face alone: the word-embedding module's output in a plain
    forward (caught by a hook) as ``raw``, and ``hidden_states`` 0..L; float64."""
    import torch
    from transformers import AlbertModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(albert))
    net = AlbertModel.from_pretrained(str(albert)).eval()
    seen = []
    hook = net.embeddings.word_embeddings.register_forward_hook(lambda _m, _a, out: seen.append(out))
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = net(**enc, output_hidden_states=True).hidden_states
    hook.remove()
    mask = enc["attention_mask"].double().numpy()[..., None]
    layers = {"raw": seen[0], **{str(i): h for i, h in enumerate(states)}}
    return {k: (v.double().numpy() * mask).sum(1) / mask.sum(1) for k, v in layers.items()}


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_raw_alone_is_stored_at_its_width_and_all_is_every_hidden_layer(albert, albert_export, hf, engine, tmp_path):
    model = str(albert_export if engine == "ort" else albert)
    assert hf["raw"].shape[1] == 16 and hf["0"].shape[1] == 32  # narrower word embeddings, as ALBERT's
    raw = LayerStore.open(extract(model, TEXTS, tmp_path / "raw", engine=engine, layers="raw",
                                  poolings=["mean"]).store.path)
    assert list(raw.layers) == ["raw"] and raw.hidden_size == 16
    np.testing.assert_allclose(np.asarray(raw["mean", "raw"], np.float64), hf["raw"], atol=1e-5, rtol=0)
    assert LayerStore.verify(raw.path)[1] == []  # opened and verified at its own width
    every = LayerStore.open(extract(model, TEXTS, tmp_path / "all", engine=engine, layers="all",
                                    poolings=["mean"]).store.path)
    assert list(every.layers) == ["0", "1", "2"] and every.hidden_size == 32
    for layer in every.layers:
        np.testing.assert_allclose(np.asarray(every["mean", layer], np.float64), hf[layer], atol=1e-5, rtol=0)


@pytest.mark.parametrize("engine", ["ort", "torch"])
def test_raw_with_other_layers_is_refused_before_any_engine_starts(albert, albert_export, engine, tmp_path,
                                                                   monkeypatch):
    from layerscope.extraction import pipeline

    model = str(albert_export if engine == "ort" else albert)
    monkeypatch.setattr(pipeline, "open_engine", lambda *a, **k: pytest.fail("an engine started"))
    with pytest.raises(InputError) as exc:
        extract(model, TEXTS, tmp_path / "s", engine=engine, layers="raw,0,2", poolings=["mean"])
    msg = str(exc.value)
    assert msg == ("layer 'raw' of this model is its word embeddings, 16 wide, and its other layers are 32 wide; "
                   "the vectors of one run have one width: ask --layers raw on its own, and layers 0..2 (or all) "
                   "in another run")
    assert not (tmp_path / "s").exists()


def test_embed_reads_all_as_every_hidden_layer_and_raw_on_its_own(albert, hf):
    import layerscope

    with layerscope.open(str(albert), engine="torch") as model:
        got = model.embed(TEXTS, poolings=["mean"])
        assert sorted(layer for _, layer in got) == ["0", "1", "2"]
        raw = model.embed(TEXTS, layers="raw", poolings=["mean"])
    np.testing.assert_allclose(np.asarray(got["mean", "2"], np.float64), hf["2"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(raw["mean", "raw"], np.float64), hf["raw"], atol=1e-5, rtol=0)


def test_an_analysis_reads_every_hidden_layer_and_refuses_raw_in_one_line(albert, hf, in_tmp_home):
    """An analysis's cached extraction holds every layer of one width (0..L here), and ``--layers`` with raw is
    refused where the run starts, saying what to ask."""
    from layerscope.analyses.base import ModelRun, check_layers
    from layerscope.analyses.cache import cached_vectors
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(str(albert))
    run = ModelRun("albert", handle, create_engine("torch", handle, device="cpu"))
    got = cached_vectors(run, TEXTS, layers=["0", "2"], poolings=["mean"])
    for layer in ("0", "2"):
        np.testing.assert_allclose(np.asarray(got["mean", layer], np.float64), hf[layer], atol=1e-5, rtol=0)
    assert check_layers("all", handle, "albert") == ["0", "1", "2"]
    with pytest.raises(InputError, match=r"^--layers raw,1 for model albert: layer 'raw' of this model is its word "
                                         r"embeddings, 16 wide, .*: ask layers 0\.\.2 \(or all\)$"):
        check_layers("raw,1", handle, "albert")


def test_the_bench_refuses_raw_with_other_layers_before_any_row(albert_export, monkeypatch):
    from layerscope.bench import runner
    from layerscope.bench.config import BenchConfig

    monkeypatch.setattr(runner, "hf_eager_row", lambda *a, **k: pytest.fail("a row ran"))
    cfg = BenchConfig(model=str(albert_export), engines=["ort"], texts=TEXTS, corpus="test", layers="raw,1",
                      include_st=False)
    with pytest.raises(InputError, match=r"16 wide, and its other layers are 32 wide; .*: ask layers 0\.\.2 \(or all\)$"):
        runner.run_bench(cfg)
