"""``layerscope run`` pays for the layers it asks: its engine runs to the deepest one (early exit), and the
analyses' vector cache grows by layer (a later run extracts only what no cached store holds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_identity_guards import _pairs  # six scored pairs of short sentences

LAYERS = 6  # deep enough that layers 0,1 leave most blocks out


@pytest.fixture(scope="module")
def deep_gpt2(tmp_path_factory):
    """A tiny GPT-2 with 6 blocks, exported with the default in-graph poolings."""
    import tiny_models
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("deep")
    before = tiny_models.LAYERS
    tiny_models.LAYERS = LAYERS
    try:
        model = tiny_models.build_tiny_model("gpt2", root / "gpt2-6", seed=2)
    finally:
        tiny_models.LAYERS = before
    export_model(resolve_source(str(model)), root / "onnx")
    return model, root / "onnx"


def _stores(home: Path) -> list[dict]:
    """The cache's stores: their layers and poolings, as store.json records them."""
    out = []
    for path in sorted((home / "stores").iterdir()):
        settings = json.loads((path / "store.json").read_text())["settings"]
        out.append({"path": path, "layers": settings["layers"], "poolings": settings["poolings"]})
    return out


def _hf_mean(model_dir: Path, texts: list[str]) -> list[np.ndarray]:
    """Each hidden state of plain transformers, mean-pooled over the real tokens, one text at a time."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModel.from_pretrained(str(model_dir), use_safetensors=True, attn_implementation="eager").eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            out = net(**tok(text, return_tensors="pt"), output_hidden_states=True)
            rows.append([h[0].mean(0).numpy() for h in out.hidden_states])
    return [np.stack([r[i] for r in rows]) for i in range(len(rows[0]))]


def test_run_opens_a_truncated_graph_and_the_cache_grows_by_layer(deep_gpt2, tmp_path, monkeypatch):
    from layerscope.analyses.base import RunRequest, run_analysis

    model_dir, export = deep_gpt2
    home = tmp_path / "home"
    monkeypatch.setenv("LAYERSCOPE_HOME", str(home))
    request = dict(models=[str(export)], engine="ort", poolings=["mean"], data=str(_pairs(tmp_path / "p.tsv")),
                   options={"n_boot": 0})

    first = run_analysis("sts", RunRequest(layers="0,1", out=tmp_path / "first", **request))
    (meta,) = first.results["models"].values()
    notes = meta["engine"]["notes"]
    assert any(n.startswith("early exit: layers up to 1, pooled outputs only") for n in notes), notes
    assert (export / "model.upto-1.pooled.onnx").exists()  # the graph the engine ran, cut after block 1
    (store,) = _stores(home)
    assert store["layers"] == ["raw", "0", "1"]  # what the run paid for, nothing deeper

    grown = run_analysis("sts", RunRequest(layers="all", out=tmp_path / "all", **request))
    (meta,) = grown.results["models"].values()
    assert not any(n.startswith("early exit: layers up to") for n in meta["engine"]["notes"])
    stores = _stores(home)
    assert [s["layers"] for s in stores if s["path"] != store["path"]] == [[str(i) for i in range(2, LAYERS + 1)]]
    assert store["path"].exists()  # the first store is kept and read, not made again

    def rows(outcome) -> dict[str, dict]:
        return {r["layer"]: r for r in outcome.results["per_model"][next(iter(outcome.results["per_model"]))]
                ["tables"]["layers"]}

    shared = rows(first)
    later = rows(grown)
    assert list(later) == ["raw"] + [str(i) for i in range(LAYERS + 1)]
    for layer in ("0", "1"):
        assert later[layer]["spearman"] == shared[layer]["spearman"]
        assert later[layer]["pearson"] == shared[layer]["pearson"]

    # the grown cache holds what plain transformers computes for each layer, the early-exit one and the later one
    from layerscope.store.store import LayerStore

    texts = LayerStore.open(store["path"]).texts()
    hf = _hf_mean(model_dir, texts)
    by_layer = {}
    for s in stores:
        st = LayerStore.open(s["path"])
        for layer in st.layers:
            if layer != "raw":
                by_layer.setdefault(layer, np.asarray(st["mean", layer]))
    for layer, got in by_layer.items():
        np.testing.assert_allclose(got, hf[int(layer)], atol=2e-5, rtol=0, err_msg=f"layer {layer}")

    # fewer layers: everything is read from the cache, nothing extracted
    said: list[str] = []

    class Console:
        def print(self, msg):
            said.append(str(msg))

    again = run_analysis("sts", RunRequest(layers="1,4", out=tmp_path / "fewer", console=Console(), **request))
    assert len(_stores(home)) == len(stores)
    assert any("reusing cached vectors of layers 1,4" in line for line in said), said
    assert not any("extracting layers" in line for line in said), said
    assert rows(again)["4"]["spearman"] == later["4"]["spearman"]


def test_every_door_opens_its_engine_by_the_one_early_exit_rule(deep_gpt2, tmp_path, monkeypatch):
    """embed, an extraction, an isolated bench row and run, asked for layers 0 and 1 in mean pooling, all open
    the engine for depth 1 with pooled outputs only."""
    import layerscope.export.open as opener
    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.bench.worker import _engine_row
    from layerscope.extraction import pipeline

    _, export = deep_gpt2
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    opened: dict[str, tuple] = {}
    real = opener.open_engine

    def spy(door):
        def open_engine(model, engine, **options):
            opened[door] = (options.get("depth"), options.get("pooled_only"))
            return real(model, engine, **options)
        return open_engine

    texts = ["a cat sits", "dogs run fast", "the market opens"]
    monkeypatch.setattr(pipeline, "open_engine", spy("embed"))
    pipeline.embed(str(export), texts, engine="ort", layers="0,1", poolings=["mean"])
    monkeypatch.setattr(pipeline, "open_engine", spy("extract"))
    pipeline.extract(str(export), texts, tmp_path / "store", engine="ort", layers="0,1", poolings=["mean"])
    monkeypatch.setattr(opener, "open_engine", spy("bench"))
    row = _engine_row({"export_dir": str(export), "engine": "ort", "layers": ["0", "1"], "pooling": "mean",
                       "max_batch": 64})
    assert any(n.startswith("early exit: layers up to 1") for n in row.info["notes"]), row.info["notes"]
    monkeypatch.setattr(opener, "open_engine", spy("run"))
    run_analysis("sts", RunRequest(models=[str(export)], engine="ort", layers="0,1", poolings=["mean"],
                                   data=str(_pairs(tmp_path / "p.tsv")), out=tmp_path / "r", options={"n_boot": 0}))
    assert opened == {door: (1, True) for door in ("embed", "extract", "bench", "run")}


def test_the_early_exit_rule():
    """Depth from the deepest layer read; pooled outputs only where nothing else is read: worked by hand."""
    from layerscope.extraction.engine_plan import EngineReads, early_exit
    from layerscope.model.manifest_type import Manifest

    m = Manifest.from_dict({"source": {"spec": "k"}, "family": "gpt2", "num_layers": 6, "hidden_size": 4,
                            "max_length": 64, "pooled_modes": ["mean", "last"],
                            "pooled_layers": ["raw", "0", "1", "2", "3", "4", "5", "6"]})

    def plan(layers, poolings=("mean",), tokens=False):
        got = early_exit(m, EngineReads.of(layers, poolings, tokens=tokens))
        return got.depth, got.pooled_only

    assert plan(["0", "2", "1"]) == (2, True)
    assert plan(["raw"]) == (-1, True)
    assert plan(["raw", "6"], ("mean", "last")) == (6, True)  # every block, pooled-only graph of the whole model
    assert plan(["1"], ("mean", "max")) == (1, False)  # max is not pooled in this graph: token states leave it
    assert plan(["1"], tokens=True) == (1, False)  # stored tokens
    assert plan(None) == (6, False)  # the whole model: the analysis reads beyond the asked layers
