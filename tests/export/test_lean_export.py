"""The streamed export (traced without weights, each written from the model's tensor) equals the ordinary one.

Run on tiny models with the external-data threshold lowered, as tests/export/test_external_data.py does.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from layerscope.export import exporter, lean
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today"]


def _outputs(export_dir):
    from layerscope.model.tokenize import Encoder
    from layerscope.engines.ort_session import make_session
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(export_dir)
    session = make_session(export_dir / "model.onnx", "CPUExecutionProvider")
    batch = Encoder(handle.tokenizer(), [i.name for i in session.get_inputs()], 64)(TEXTS)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {i.name: batch.inputs[i.name] for i in session.get_inputs()})))


def _weight_digests(export_dir) -> list[tuple]:
    """(dtype, shape, sha256) of every initializer over 1 KiB: the weights as stored, names aside."""
    model = onnx.load(str(export_dir / "model.onnx"))
    out = []
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        if arr.nbytes > 1024:
            out.append((str(arr.dtype), arr.shape, hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()))
    return sorted(out)


@pytest.mark.parametrize("family", ["bert", "gpt2", "qwen3", "t5-encoder", "deberta-v2"])
def test_streamed_export_is_bit_identical_to_the_ordinary_one(family, tiny_model, tmp_path, monkeypatch):
    """Catches: a weight written from the wrong tensor or untransposed, a folded node evaluated wrongly,
    padding that shifts an offset, and the streamed path not being taken at all (the spy)."""
    calls = []
    real = lean.attach_weights
    monkeypatch.setattr(lean, "attach_weights", lambda *a, **k: calls.append(1) or real(*a, **k))
    ordinary = tmp_path / "ordinary"
    export_model(resolve_source(str(tiny_model(family))), ordinary, pooled=["mean"])
    assert not calls  # below the threshold: the ordinary path
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)
    streamed = tmp_path / "streamed"
    manifest = export_model(resolve_source(str(tiny_model(family))), streamed, pooled=["mean"])
    assert calls == [1] and manifest.external_data is True
    from layerscope.export import external

    assert external.inline_bytes(onnx.load(str(streamed / "model.onnx"), load_external_data=False)) < 10_000
    assert _weight_digests(streamed) == _weight_digests(ordinary)  # the same weights, transposed the same way
    a, b = _outputs(ordinary), _outputs(streamed)
    assert list(a) == list(b) and "raw_embeddings" in a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    graph = onnx.load(str(streamed / "model.onnx"), load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    assert not [n.name for n in graph.node if n.op_type == "Transpose" and n.input[0] in inits]  # folded


def test_streamed_offsets_are_page_aligned_and_inside_the_file(tiny_model, tmp_path, monkeypatch):
    from layerscope.export import external

    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)
    out = tmp_path / "exp"
    export_model(resolve_source(str(tiny_model("qwen2"))), out, pooled=["mean"])
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    size = (out / "model.onnx_data").stat().st_size
    tensors = external.external_tensors(graph)
    assert tensors
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        assert int(info["offset"]) % external.ALIGN == 0
        assert int(info["offset"]) + int(info["length"]) <= size


def test_streamed_fp16_export_is_bit_identical_to_the_ordinary_one(tiny_model, tmp_path, monkeypatch):
    """``--dtype fp16`` (weights traced in half precision) takes the streamed path too, with the same
    result. Catches: fp16 weights written as fp32 (or cast), and the fp32-kept LayerNorm/Softmax edits
    failing on a graph whose initializers are external."""
    ordinary = tmp_path / "ordinary"
    export_model(resolve_source(str(tiny_model("qwen2"))), ordinary, pooled=["mean"], dtype="fp16")
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 5_000)
    streamed = tmp_path / "streamed"
    manifest = export_model(resolve_source(str(tiny_model("qwen2"))), streamed, pooled=["mean"], dtype="fp16")
    assert manifest.external_data is True and manifest.to_dict()["fp16_nodes_kept_fp32"] > 0
    assert _weight_digests(streamed) == _weight_digests(ordinary)
    assert any(d[0] == "float16" for d in _weight_digests(streamed))
    a, b = _outputs(ordinary), _outputs(streamed)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_streamed_torch_onnx_moe_export_is_bit_identical_to_the_ordinary_one(tmp_path, monkeypatch):
    """Mixtral (no Optimum config: the plain torch.onnx path, every expert computed) streams its weights above
    the threshold as the Optimum path does. Catches: the torch.onnx path holding torch.onnx's copy of every
    weight at any size, and weights named after the wrapper module not found (an ExportError)."""
    import tiny_zoo

    calls = []
    real = lean.attach_weights
    monkeypatch.setattr(lean, "attach_weights", lambda *a, **k: calls.append(1) or real(*a, **k))
    ckpt = tiny_zoo.build_zoo_model("mixtral", tmp_path / "ckpt")
    ordinary = tmp_path / "ordinary"
    assert export_model(resolve_source(str(ckpt)), ordinary, pooled=["mean"]).to_dict()["export_path"] == "torch"
    assert not calls
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)
    streamed = tmp_path / "streamed"
    manifest = export_model(resolve_source(str(ckpt)), streamed, pooled=["mean"])
    assert calls == [1] and manifest.external_data is True
    assert _weight_digests(streamed) == _weight_digests(ordinary)
    a, b = _outputs(ordinary), _outputs(streamed)
    assert list(a) == list(b) and "raw_embeddings" in a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
