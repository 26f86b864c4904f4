"""Early exit: an engine asked for layers up to d computes no block after d, and its outputs equal the full
model's (ONNX Runtime and OpenVINO on a pruned graph, PyTorch on the truncated block stack)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from layerscope.engines.base import create_engine

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought 3 apples and 12 oranges"]
POOLINGS = ["mean", "last"]
# the ONNX node-name scope of block i (0-based module index) in torch.onnx's export of each family
BLOCK_SCOPE = {"bert": "/encoder/layer.{i}/", "gpt2": "/h.{i}/"}


@pytest.fixture(scope="module")
def exports(tiny_export):
    return {family: tiny_export(family) for family in ("bert", "gpt2")}


def _hf_states(model_dir, batch) -> list[np.ndarray]:
    """Plain Hugging Face, the whole model: every hidden state, float32."""
    import torch
    from transformers import AutoModel

    net = AutoModel.from_pretrained(str(model_dir), use_safetensors=True, attn_implementation="eager").eval()
    with torch.inference_mode():
        out = net(**{k: torch.from_numpy(v) for k, v in batch.inputs.items()}, output_hidden_states=True)
    return [h.numpy() for h in out.hidden_states]


@pytest.mark.parametrize("family", ["bert", "gpt2", "qwen2", "deberta-v2"])
def test_torch_truncated_stack_equals_the_whole_model(family, tiny_model):
    """Every layer up to d of the first d blocks equals Hugging Face's whole-model hidden state d (decoders:
    layer d < L carries no final norm; d = 0 runs no block at all, or one where the model needs one: DeBERTa-v2)."""
    model_dir = tiny_model(family)
    full = create_engine("torch", str(model_dir))
    batch = full.encoder()(TEXTS)
    ref = _hf_states(model_dir, batch)
    num_layers = full.manifest.num_layers
    assert len(ref) == num_layers + 1
    for depth in range(-1, num_layers):
        eng = create_engine("torch", str(model_dir), depth=depth)
        assert eng.depth == depth and any("early exit" in n for n in eng.info.notes)
        layers = [str(i) for i in range(depth + 1)]
        got = eng.run_tokens(batch, layers)
        for layer, states in zip(layers, got):
            np.testing.assert_array_equal(states, ref[int(layer)], err_msg=f"{family} depth {depth} layer {layer}")
        # the blocks after depth are gone from the module, not just skipped
        assert sum(1 for _ in eng.net.parameters()) < sum(1 for _ in full.net.parameters())


@pytest.mark.parametrize("engine", ["ort", "ov"])
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_pruned_graph_outputs_equal_the_full_graph(family, engine, exports):
    if engine == "ov":
        pytest.importorskip("openvino")
    full = create_engine(engine, exports[family])
    batch = full.encoder()(TEXTS)
    names = full.layer_names
    ref_tokens = full.run_tokens(batch, names)
    ref_pooled = full.run(batch, names, POOLINGS)
    num_layers = full.manifest.num_layers
    for depth in range(-1, num_layers):
        eng = create_engine(engine, exports[family], depth=depth)
        assert eng.depth == depth
        assert any(n.startswith("early exit:") for n in eng.info.notes), eng.info.notes
        layers = ["raw"] + [str(i) for i in range(depth + 1)]
        rows = [names.index(n) for n in layers]
        got_tokens = eng.run_tokens(batch, layers)
        got_pooled = eng.run(batch, layers, POOLINGS)
        for i, layer in enumerate(layers):
            np.testing.assert_array_equal(got_tokens[i], ref_tokens[rows[i]], err_msg=f"{engine} {depth} {layer}")
        for mode in POOLINGS:  # the graph's own pooled outputs, re-pointed at the kept layers
            assert eng.pooled_layers == layers
            np.testing.assert_array_equal(got_pooled[mode], ref_pooled[mode][rows], err_msg=f"{engine} {mode}")


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_pruned_graph_has_no_node_of_a_later_block(family, exports):
    export_dir = exports[family]
    full = onnx.load(str(export_dir / "model.onnx"), load_external_data=False)
    scope = BLOCK_SCOPE[family]

    def blocks(graph) -> set[int]:
        return {i for i in range(2) if any(scope.format(i=i) in n.name for n in graph.node)}

    assert blocks(full.graph) == {0, 1}  # the names this test reads are the export's
    create_engine("ort", export_dir, depth=1)
    create_engine("ort", export_dir, depth=-1)
    upto1 = onnx.load(str(export_dir / "model.upto-1.onnx"), load_external_data=False)
    raw = onnx.load(str(export_dir / "model.upto-raw.onnx"), load_external_data=False)
    assert blocks(upto1.graph) == {0}  # hidden_states.1 is block 0's output: block 1 is not computed
    assert blocks(raw.graph) == set()
    assert len(raw.graph.node) < len(upto1.graph.node) < len(full.graph.node)
    pooled = [o.name for o in full.graph.output if o.name.startswith("pooled.")]
    assert [o.name for o in upto1.graph.output] == ["hidden_states.0", "hidden_states.1", "raw_embeddings", *pooled]
    assert [o.name for o in raw.graph.output] == ["raw_embeddings", *pooled]


def test_a_store_of_the_first_layers_equals_those_layers_of_a_full_store(exports, tmp_path):
    from layerscope.extraction.pipeline import extract
    from layerscope.store.store import LayerStore

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    import importlib.util

    for engine in ("ort", "torch") + (("ov",) if importlib.util.find_spec("openvino") else ()):
        part = extract(exports["gpt2"], corpus, tmp_path / f"part-{engine}", engine=engine, layers="0,1",
                       poolings=POOLINGS, progress=False)
        whole = extract(exports["gpt2"], corpus, tmp_path / f"whole-{engine}", engine=engine, layers="all",
                        poolings=POOLINGS, progress=False)
        assert any(n.startswith("early exit") for n in part.engine["notes"])
        if engine != "torch":  # mean and last are pooled in the graph: its hidden states stay inside
            assert any("pooled outputs only" in n for n in part.engine["notes"])
        assert not any("layers up to" in n for n in whole.engine["notes"])
        a, b = LayerStore.open(tmp_path / f"part-{engine}"), LayerStore.open(tmp_path / f"whole-{engine}")
        for mode in POOLINGS:
            for layer in ("0", "1"):
                np.testing.assert_array_equal(a[mode, layer], b[mode, layer], err_msg=f"{engine} {mode} {layer}")


def test_the_cached_graph_is_reused_and_made_again_when_the_export_changes(tiny_export, tmp_path):
    export_dir = tiny_export("bert", to=tmp_path / "onnx")  # a fresh copy: no derived graph in it yet
    first = create_engine("ort", export_dir, depth=0)
    made = export_dir / "model.upto-0.onnx"
    record = json.loads((export_dir / "model.upto-0.json").read_text())
    assert not first.info.notes[-1].endswith(", cached)")
    assert record["check"]["max_abs"] == 0.0 and set(record["check"]["outputs"]) == set(record["outputs"])
    stamp = made.stat().st_mtime_ns
    again = create_engine("ort", export_dir, depth=0)
    assert again.info.notes[-1].endswith(", cached)") and made.stat().st_mtime_ns == stamp
    from layerscope.ownership import foreign

    assert not foreign(export_dir)  # the derived graph and its record are layerscope's: --force may replace them
    # the export changes (a metadata entry is enough to change its content): the derived graph is made again
    model = onnx.load(str(export_dir / "model.onnx"))
    onnx.helper.set_model_props(model, {"edited": "yes"})
    onnx.save(model, str(export_dir / "model.onnx"))
    from layerscope.hashing import file_sha256

    manifest = json.loads((export_dir / "manifest.json").read_text())
    manifest["onnx_sha256"] = file_sha256(export_dir / "model.onnx")  # as an export rewritten in place records
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    changed = create_engine("ort", export_dir, depth=0)
    assert not changed.info.notes[-1].endswith(", cached)")
    assert json.loads((export_dir / "model.upto-0.json").read_text())["source_sha256"] != record["source_sha256"]
    assert {p.key: p.value for p in onnx.load(str(made), load_external_data=False).metadata_props}["edited"] == "yes"


def test_an_export_with_external_data_is_pruned_without_copying_weights(tiny_model, tmp_path, monkeypatch):
    from layerscope.export import exporter, external
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)
    export_dir = tmp_path / "big"
    assert export_model(resolve_source(str(tiny_model("qwen2"))), export_dir).external_data is True
    full = create_engine("ort", export_dir)
    batch = full.encoder()(TEXTS)
    eng = create_engine("ort", export_dir, depth=1)
    derived = export_dir / "model.upto-1.onnx"
    assert eng.depth == 1
    assert external.data_files(derived) == external.data_files(export_dir / "model.onnx")  # the export's own file
    assert not (export_dir / "model.upto-1.onnx_data").exists()
    assert derived.stat().st_size <= (export_dir / "model.onnx").stat().st_size  # no weight bytes copied in
    layers = ["raw", "0", "1"]
    for got, ref in zip(eng.run_tokens(batch, layers), full.run_tokens(batch, layers)):
        np.testing.assert_array_equal(got, ref)


def test_a_derived_graph_that_fails_its_check_is_not_run(exports, monkeypatch, tmp_path):
    import shutil

    from layerscope.engines import truncate

    export_dir = tmp_path / "copy"
    shutil.copytree(exports["bert"], export_dir)
    for made in export_dir.glob("model.upto-*"):  # derived graphs other tests cached: this one is made here
        made.unlink()
    monkeypatch.setattr(truncate, "check_outputs", lambda src, dst, names, *a: {n: 1.0 for n in names})
    eng = create_engine("ort", export_dir, depth=0)
    assert eng.depth is None
    assert any(n.startswith("early exit off") for n in eng.info.notes)
    assert not (export_dir / "model.upto-0.onnx").exists() and not (export_dir / "model.upto-0.json").exists()
    assert "hidden_states.2" in eng.output_names  # the full graph runs


def test_a_deeper_layer_than_the_engine_was_opened_for_is_one_line(exports):
    from layerscope.errors import InputError

    eng = create_engine("ort", exports["bert"], depth=0)
    batch = eng.encoder()(TEXTS[:1])
    with pytest.raises(InputError, match="opened for layers up to 0"):
        eng.run(batch, ["0", "2"], ["mean"])


@pytest.mark.parametrize("engine", ["ort", "ov"])
def test_a_pooled_only_run_keeps_the_hidden_states_inside_the_graph(engine, exports):
    from layerscope.errors import InputError

    if engine == "ov":
        pytest.importorskip("openvino")
    export_dir = exports["gpt2"]
    full = create_engine(engine, export_dir)
    batch = full.encoder()(TEXTS)
    names = full.layer_names
    ref = full.run(batch, names, POOLINGS)
    eng = create_engine(engine, export_dir, depth=1, pooled_only=True)
    layers = ["raw", "0", "1"]
    assert sorted(eng.output_names) == sorted(f"pooled.{m}" for m in full.manifest.pooled_modes)
    assert eng.depth == 1 and eng.pooled_layers == layers
    got = eng.run(batch, layers, POOLINGS)
    for mode in POOLINGS:
        np.testing.assert_array_equal(got[mode], ref[mode][[names.index(n) for n in layers]])
    with pytest.raises(InputError, match="pooled vectors only"):
        eng.run_tokens(batch, ["0"])
    graph = onnx.load(str(export_dir / "model.upto-1.pooled.onnx"), load_external_data=False)
    assert not [o.name for o in graph.graph.output if not o.name.startswith("pooled.")]
    # every layer: the export's own graph (nothing derived), its pooled outputs fetched alone
    every = create_engine(engine, export_dir, pooled_only=True)
    assert every.depth is None and every.pooled_layers == names and not (export_dir / "model.upto-2.pooled.onnx").exists()
    got = every.run(batch, names, POOLINGS)
    for mode in POOLINGS:
        np.testing.assert_array_equal(got[mode], ref[mode])
