"""``inspect export --dtype fp16``: half-precision weights, fp32 outputs, sensitive ops kept fp32."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from layerscope.errors import ExportError, InputError
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source
from layerscope.export.half import check_dtype, fp16_failures, fp16_min_cos, fp16_tolerance


@pytest.fixture(scope="module")
def half_exports(tiny_model, tmp_path_factory):
    cache = {}

    def get(family):
        if family not in cache:
            root = tmp_path_factory.mktemp(f"half-{family}")
            cache[family] = (export_model(resolve_source(str(tiny_model(family))), root / "fp32"),
                             export_model(resolve_source(str(tiny_model(family))), root / "fp16", dtype="fp16"), root)
        return cache[family]

    return get


@pytest.mark.parametrize("family", ["bert", "qwen2"])
def test_fp16_export_is_half_size_with_fp32_outputs(family, half_exports):
    m32, m16, root = half_exports(family)
    assert m16.precision == "fp16" and m32.precision == "fp32"
    graph = onnx.load(str(root / "fp16" / "model.onnx"))
    big = [t for t in graph.graph.initializer if np.prod(t.dims) >= 256]
    assert big and all(t.data_type == onnx.TensorProto.FLOAT16 for t in big)
    assert all(o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for o in graph.graph.output)
    weights = {d: sum(len(t.raw_data) for t in onnx.load(str(root / d / "model.onnx")).graph.initializer)
               for d in ("fp32", "fp16")}
    assert weights["fp16"] < 0.55 * weights["fp32"]
    assert m16.to_dict()["onnx_bytes"] < m32.to_dict()["onnx_bytes"]
    tol = m16.parity.tolerance_fp16
    assert set(tol["min_cos"]) == set(m16.parity.outputs)
    for name, s in m16.parity.outputs.items():
        assert s.min_cos >= tol["min_cos"][name], name
    assert m16.to_dict()["export_peak_rss_bytes"] > 0
    saved = json.loads((root / "fp16" / "manifest.json").read_text())
    assert saved["parity"]["tolerance_fp16"]["rule"].startswith("min_cos >= 1 -")


def test_fp16_keeps_layernorm_and_softmax_in_fp32(half_exports):
    _, m16, root = half_exports("bert")
    graph = onnx.load(str(root / "fp16" / "model.onnx"))
    inferred = onnx.shape_inference.infer_shapes(graph)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    types.update({t.name: t.data_type for t in graph.graph.initializer})
    sensitive = [n for n in graph.graph.node if n.op_type in ("LayerNormalization", "Softmax")]
    assert sensitive and m16.to_dict()["fp16_nodes_kept_fp32"] >= len(sensitive)
    for node in sensitive:
        assert types.get(node.input[0]) == onnx.TensorProto.FLOAT, node.name


def test_fp16_tolerance_grows_with_depth_and_fails_drift():
    assert fp16_min_cos("hidden_states.1", 36) == pytest.approx(0.999)
    assert fp16_min_cos("hidden_states.36", 36) == pytest.approx(0.997)
    assert fp16_min_cos("pooled.mean", 36) == fp16_min_cos("hidden_states.36", 36)
    tol = fp16_tolerance(["hidden_states.1", "hidden_states.36"], 36)
    ok = {"hidden_states.1": {"min_cos": 0.9995}, "hidden_states.36": {"min_cos": 0.9975}}
    assert fp16_failures(ok, tol) == []
    drift = {"hidden_states.1": {"min_cos": 0.998}, "hidden_states.36": {"min_cos": float("nan")}}
    assert len(fp16_failures(drift, tol)) == 2


def test_dtype_choices():
    assert check_dtype("float16") == "fp16" and check_dtype("FP32") == "fp32"
    with pytest.raises(InputError, match="bf16"):
        check_dtype("bf16")
    with pytest.raises(InputError, match="fp32 or fp16"):
        check_dtype("int4")


def test_fp16_drift_beyond_tolerance_writes_nothing(tiny_model, tmp_path, monkeypatch):
    from layerscope.export import half

    monkeypatch.setattr(half, "FP16_COS_BUDGET", 1e-12)  # no model keeps cosine 1 - 1e-12 in fp16
    with pytest.raises(ExportError, match="drifts from PyTorch fp32"):
        export_model(resolve_source(str(tiny_model("qwen2"))), tmp_path / "out", dtype="fp16")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_fp16_export_prints_its_cosine_rule(tiny_model, tmp_path):
    from typer.testing import CliRunner

    from layerscope.cli import app

    out = tmp_path / "cli16"
    r = CliRunner().invoke(app, ["export", str(tiny_model("qwen2")), "--out", str(out), "--dtype", "fp16",
                                 "--pooled", "mean"])
    assert r.exit_code == 0, r.output
    assert "min cosine" in r.output and "tolerance 0.99" in r.output
    assert json.loads((out / "manifest.json").read_text())["precision"] == "fp16"
