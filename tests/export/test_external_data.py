"""Exports over 2 GiB: the external-data path, run on tiny models with the size threshold lowered."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from layerscope.export import external
from layerscope.export import exporter
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today", ""]



def _run(export_dir):
    from transformers import AutoTokenizer

    from layerscope.model.tokenize import Encoder
    from layerscope.engines.ort_session import make_session
    from layerscope.model.source import prepare_tokenizer

    tok = AutoTokenizer.from_pretrained(str(export_dir))
    prepare_tokenizer(tok)
    session = make_session(export_dir / "model.onnx", "CPUExecutionProvider")
    batch = Encoder(tok, [i.name for i in session.get_inputs()], 64)(TEXTS)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {i.name: batch.inputs[i.name] for i in session.get_inputs()})))


@pytest.mark.parametrize("family", ["bert", "qwen2"])
def test_external_data_export_is_bit_identical(family, tiny_model, tiny_export, tmp_path, monkeypatch):
    normal = tiny_export(family, to=tmp_path / "normal")  # the ordinary export, before the limit is lowered
    monkeypatch.setattr(exporter, "EXTERNAL_DATA_BYTES", 10_000)
    big = tmp_path / "big"
    manifest = export_model(resolve_source(str(tiny_model(family))), big)
    assert manifest.external_data is True
    assert json.loads((normal / "manifest.json").read_text())["external_data"] is False
    assert (big / "model.onnx_data").stat().st_size > (big / "model.onnx").stat().st_size
    graph = onnx.load(str(big / "model.onnx"), load_external_data=False)
    assert external.uses_external_data(graph)
    assert [t.name for t in external.data_files(big / "model.onnx")] == ["model.onnx_data"]
    a, b = _run(normal), _run(big)
    assert list(a) == list(b) and "pooled.mean" in a and "raw_embeddings" in a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_consolidate_streams_per_tensor_files_into_one(tmp_path):
    """torch writes one file per tensor over 2 GiB; consolidate gathers them with identical values."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=False, size_threshold=0)
    per_tensor = sorted(p.name for p in tmp_path.iterdir() if p.name != "model.onnx")
    assert len(per_tensor) == 2
    written = external.consolidate(path, chunk=100)  # chunk smaller than a tensor: the loop really streams
    assert written >= w1.nbytes + w2.nbytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx_data"]
    loaded = onnx.load(str(path))
    got = {t.name: numpy_helper.to_array(t) for t in loaded.graph.initializer}
    np.testing.assert_array_equal(got["w1"], w1)
    np.testing.assert_array_equal(got["w2"], w2)
    assert external.consolidate(path) == 0  # idempotent


def test_consolidate_refuses_locations_outside_the_dir(tmp_path):
    from onnx import TensorProto, helper

    from layerscope.errors import ExportError

    t = helper.make_tensor("w", TensorProto.FLOAT, [1], [0.0])
    t.ClearField("float_data")
    external._set_info(t, "../escape.bin", 0, 4)
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [t])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(ExportError, match="outside"):
        external.consolidate(path)
