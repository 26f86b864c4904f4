"""Every graph layerscope derives from an export (early exit's, per-layer pooling's, the graph in blocks, the lens
head, the attention graph) is used only where what its record says holds against the graph itself and against
its source as it is now (model/derived.py); otherwise it is made again, and ``layerscope verify`` says so."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

from layerscope.engines.base import create_engine

TEXTS = ["a dog plays in the snow", "Hi", "she bought 3 apples and 12 oranges"]


def _rewrite_source(export_dir) -> None:
    """``model.onnx`` rewritten in place (a metadata entry changes its content, not what it computes) and the
    manifest's hash of it with it, as an export rewritten in place records: the export still opens."""
    from layerscope.hashing import file_sha256

    model = onnx.load(str(export_dir / "model.onnx"))
    onnx.helper.set_model_props(model, {"rewritten": "yes"})
    onnx.save(model, str(export_dir / "model.onnx"))
    manifest = json.loads((export_dir / "manifest.json").read_text())
    manifest["onnx_sha256"] = file_sha256(export_dir / "model.onnx")
    manifest["files"]["model.onnx"]["sha256"] = manifest["onnx_sha256"]
    manifest["files"]["model.onnx"]["bytes"] = (export_dir / "model.onnx").stat().st_size
    (export_dir / "manifest.json").write_text(json.dumps(manifest))


def _edit(path, change) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps(change(data)))


def _made_again(engine) -> bool:
    return not any(n.endswith(", cached)") for n in engine.info.notes)


@pytest.fixture(scope="module")
def bert(tiny_export):
    return tiny_export("bert", pooled=["mean"])


def test_a_record_that_says_other_pooled_layers_makes_the_graph_again(bert):
    """The campaign's case: ``pooled_layers`` of ``model.upto-1.json`` reversed. Catches: the rows of the pooled
    output stored under the wrong layers (layer 1 off by 1.6) with the note "equal to the full graph bit for bit"."""
    full = create_engine("ort", bert)
    batch = full.encoder()(TEXTS)
    want = full.run(batch, ["0", "1"], ["mean"])["mean"]
    create_engine("ort", bert, depth=1)
    record = bert / "model.upto-1.json"
    layers = json.loads(record.read_text())["pooled_layers"]
    assert layers[-2:] == ["0", "1"]
    _edit(record, lambda d: {**d, "pooled_layers": d["pooled_layers"][::-1]})
    again = create_engine("ort", bert, depth=1)
    assert _made_again(again) and again.depth == 1
    assert json.loads(record.read_text())["pooled_layers"] == layers
    np.testing.assert_array_equal(again.run(batch, ["0", "1"], ["mean"])["mean"], want)
    # a record that says the graph holds another number of nodes, or a check it never passed: made again too
    for change in (lambda d: {**d, "nodes": d["nodes"] + 1}, lambda d: {**d, "check": {**d["check"], "max_abs": 1.0}}):
        _edit(record, change)
        assert _made_again(create_engine("ort", bert, depth=1))
    assert not _made_again(create_engine("ort", bert, depth=1))  # and then reused as it is


@pytest.mark.parametrize("kind", ["list", "string", "truncated"])
def test_a_damaged_record_makes_the_graph_again(bert, kind):
    """Catches: a record that is a JSON list (or another non-object) failing every run with an internal error."""
    create_engine("ort", bert, depth=0)
    record = bert / "model.upto-0.json"
    record.write_text({"list": "[1, 2]", "string": '"x"', "truncated": '{"recipe": 2, "dep'}[kind])
    again = create_engine("ort", bert, depth=0)
    assert _made_again(again) and again.depth == 0
    assert isinstance(json.loads(record.read_text()), dict)


def test_a_fifo_as_a_record_is_one_line(bert):
    """Catches: a FIFO in place of a derived graph's record hanging the run (opened for reading, blocking)."""
    from layerscope.errors import InputError

    create_engine("ort", bert, depth=0)
    record = bert / "model.upto-0.json"
    record.unlink()
    os.mkfifo(record)
    try:
        with pytest.raises(InputError, match="model.upto-0.json is a FIFO"):
            create_engine("ort", bert, depth=0)
    finally:
        record.unlink()


def test_per_layer_pooling_is_made_again_when_its_source_is_rewritten(tiny_export, tmp_path):
    """The pooled-only graph of every layer (each layer pooled as it is made): reused while its source holds,
    made again once the export's graph is rewritten in place. Catches: a record without its source's hash, or one
    compared with nothing, running the old model's pooling."""
    export_dir = tiny_export("bert", pooled=["mean"], to=tmp_path / "e")
    layers = [str(i) for i in range(3)]
    create_engine("ort", export_dir, depth=2, pooled_only=True)
    record = export_dir / "model.upto-2.pooled.json"
    before = json.loads(record.read_text())
    assert before["pooled_only"] and before["pooled_layers"][-3:] == layers
    assert not _made_again(create_engine("ort", export_dir, depth=2, pooled_only=True))
    _rewrite_source(export_dir)
    again = create_engine("ort", export_dir, depth=2, pooled_only=True)
    assert _made_again(again) and json.loads(record.read_text())["source_sha256"] != before["source_sha256"]
    props = {p.key: p.value for p in onnx.load(str(export_dir / "model.upto-2.pooled.onnx"),
                                               load_external_data=False).metadata_props}
    assert props.get("rewritten") == "yes"


def test_the_graph_in_blocks_holds_its_record_and_is_made_again_when_its_source_is_rewritten(tiny_export, tmp_path):
    """Catches: the graph in blocks cached without (or never compared with) its source's hash, an export
    rewritten in place then running the old model's attention; a record claiming other layers in blocks or other
    pooled layers than the graph holds read as it is."""
    export_dir = tiny_export("qwen3", pooled=["mean"], to=tmp_path / "q")
    first = create_engine("ort", export_dir, attention="blocked")
    record = export_dir / "model.blocked.json"
    before = json.loads(record.read_text())
    assert before["layers"] == 2 and not any(n.endswith(", cached)") for n in first.info.notes)
    assert any(n.endswith(", cached)") for n in create_engine("ort", export_dir, attention="blocked").info.notes)
    for change in (lambda d: {**d, "layers": d["layers"] - 1}, lambda d: {**d, "pooled_layers": d["pooled_layers"][::-1]}):
        _edit(record, change)  # a record saying fewer layers in blocks, or other pooled layers, than the graph holds
        assert _made_again(create_engine("ort", export_dir, attention="blocked"))
    _rewrite_source(export_dir)
    again = create_engine("ort", export_dir, attention="blocked")
    assert _made_again(again) and json.loads(record.read_text())["source_sha256"] != before["source_sha256"]
    props = {p.key: p.value for p in onnx.load(str(export_dir / "model.blocked.onnx"),
                                               load_external_data=False).metadata_props}
    assert props.get("rewritten") == "yes"


def test_the_lens_head_is_made_again_when_its_source_or_weights_change(tiny_export, tmp_path):
    """Catches: a lens graph whose sidecar is compared with nothing: used after the export's graph was rewritten
    in place, after the graph file was replaced (its sha256 recorded and never compared), or after the stored head
    whose bytes it reads was rewritten."""
    from layerscope.decoding.lens_onnx import export_lens, read_sidecar
    from layerscope.model.handle import ModelHandle

    export_dir = tiny_export("gpt2", to=tmp_path / "g")
    export_lens(export_dir, 3, check=False)
    handle = ModelHandle.resolve(export_dir)
    assert read_sidecar(handle, 3) is not None
    graph = export_dir / "lens-k3.onnx"
    original = graph.read_bytes()
    model = onnx.load(str(graph), load_external_data=False)
    onnx.helper.set_model_props(model, {"replaced": "yes"})
    onnx.save(model, str(graph))
    assert read_sidecar(handle, 3) is None  # the graph is not the one its sidecar records
    graph.write_bytes(original)
    assert read_sidecar(handle, 3) is not None
    head = export_dir / "lm_head.safetensors"
    assert json.loads((export_dir / "lens-k3.json").read_text())["shared_with"] == head.name
    stored = head.read_bytes()
    head.write_bytes(stored[:-4] + b"\x00\x00\x80\x3f")  # one weight of the stored head changed in place
    assert read_sidecar(handle, 3) is None  # the weights it reads are not those it was made with
    head.write_bytes(stored)
    assert read_sidecar(handle, 3) is not None
    _rewrite_source(export_dir)
    assert read_sidecar(ModelHandle.resolve(export_dir), 3) is None  # made for the earlier model.onnx


def test_the_attention_graph_is_made_again_when_its_source_is_rewritten(tiny_export, tmp_path):
    """Catches: ``model.attn.onnx`` run with nothing compared (its sha256 recorded, never read): after the export's
    graph was rewritten in place, and after the attention graph itself was replaced."""
    from layerscope.export.attention_run import AttentionRunner, attention_export
    from layerscope.export.variants import make_variant
    from layerscope.errors import InputError
    from layerscope.model.handle import ModelHandle
    from layerscope.model.manifest import read_manifest

    export_dir = tiny_export("bert", to=tmp_path / "a")
    make_variant(export_dir, "attn")
    first = read_manifest(export_dir).variant("attn")
    AttentionRunner(export_dir, "ort")
    _rewrite_source(export_dir)
    with pytest.raises(InputError, match="attention graph cannot be used .* made for another model.onnx"):
        AttentionRunner(export_dir, "ort")  # never run as it is
    said = []
    attention_export(ModelHandle.resolve(export_dir), said.append)
    entry = read_manifest(export_dir).variant("attn")
    assert entry.raw["source_sha256"] == read_manifest(export_dir).onnx_sha256 != first.raw.get("source_sha256")
    assert said and "again" in said[0]
    runner = AttentionRunner(export_dir, "ort")
    feed = {k: v for k, v in create_engine("ort", export_dir).encoder()(TEXTS).inputs.items()}
    assert runner.run(feed).summaries
    attn = export_dir / "model.attn.onnx"
    attn.write_bytes(attn.read_bytes() + b"\x00")
    with pytest.raises(InputError, match="sha256 differs"):
        AttentionRunner(export_dir, "ort")


def test_verify_covers_every_derived_graph_and_its_record(tiny_export, tmp_path):
    """Catches: ``layerscope verify`` passing an export whose derived graph is damaged, was made from an earlier
    graph, or whose record says other pooled layers than the graph stacks."""
    from layerscope.integrity import verify_path

    export_dir = tiny_export("bert", pooled=["mean"], to=tmp_path / "v")
    create_engine("ort", export_dir, depth=1)
    create_engine("ort", export_dir, depth=2, pooled_only=True)
    checked, problems = verify_path(export_dir)
    assert problems == [] and checked > 0
    record = export_dir / "model.upto-1.json"
    _edit(record, lambda d: {**d, "pooled_layers": d["pooled_layers"][::-1]})
    assert any("model.upto-1.json says the pooled rows are layers" in p for p in verify_path(export_dir)[1])
    record.write_text("[1, 2]")
    assert any("model.upto-1.json is not a record" in p for p in verify_path(export_dir)[1])
    pooled = export_dir / "model.upto-2.pooled.onnx"
    pooled.write_bytes(pooled.read_bytes() + b"\x00")
    assert any("model.upto-2.pooled.onnx is not the graph" in p for p in verify_path(export_dir)[1])


def test_a_variant_made_for_another_graph_is_never_run(tiny_export, tmp_path):
    """A precision variant (``layerscope optimize``) records the export's graph it was made for. Catches: the int8
    graph of the earlier model run after the export was rewritten in place (only its own file's sha256 was
    compared), and verify saying nothing of it."""
    from layerscope.errors import ManifestError
    from layerscope.export.variants import make_variant
    from layerscope.model.manifest import read_manifest

    export_dir = tiny_export("bert", to=tmp_path / "i")
    make_variant(export_dir, "int8")
    made_for = read_manifest(export_dir).onnx_sha256
    create_engine("ort", export_dir, variant="int8")
    _rewrite_source(export_dir)
    with pytest.raises(ManifestError, match="model.int8.onnx was made for another model.onnx"):
        create_engine("ort", export_dir, variant="int8")
    assert read_manifest(export_dir).variant("int8").raw["source_sha256"] == made_for
    from layerscope.integrity import verify_path

    assert any("variant 'int8': model.int8.onnx was made for another" in p for p in verify_path(export_dir)[1])
    create_engine("ort", export_dir)  # the rewritten export itself still runs
