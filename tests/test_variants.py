"""Optimized and reduced-precision variants stay within the tolerance recorded in their manifest."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def export_dir(tiny_model, tmp_path_factory):
    from layerscope.export.exporter import export_model

    model = tiny_model("bert")
    out = tmp_path_factory.mktemp("export") / "tiny"
    export_model(str(model), out)
    return out


def _manifest(export_dir):
    return json.loads((export_dir / "manifest.json").read_text())


@pytest.mark.parametrize("kind", ["opt", "int8", "fp16"])
def test_variant_within_recorded_tolerance(export_dir, kind):
    from layerscope.export.manifest import file_sha256
    from layerscope.export.variants import make_variant

    entry = make_variant(export_dir, kind)
    recorded = _manifest(export_dir)["variants"][kind]
    assert recorded["file"] == f"model.{kind}.onnx"
    assert recorded["sha256"] == file_sha256(export_dir / recorded["file"])
    tol = recorded["tolerance"]
    outputs = recorded["parity"]["outputs"]
    # every output of the fp32 export is checked, none lost
    assert set(outputs) == set(_manifest(export_dir)["outputs"])
    for name, stats in outputs.items():
        assert not math.isnan(stats["min_cos"]), name
        if tol["max_abs"] is not None:
            assert stats["max_abs"] <= tol["max_abs"], name
        assert stats["min_cos"] >= tol["min_cos"], name
    assert entry["parity"] == recorded["parity"]


def test_opt_keeps_every_output_and_reports_fusions(export_dir):
    import onnx

    from layerscope.export.variants import make_variant

    entry = make_variant(export_dir, "opt")
    base = [o.name for o in onnx.load(str(export_dir / "model.onnx")).graph.output]
    opt = [o.name for o in onnx.load(str(export_dir / entry["file"])).graph.output]
    assert opt == base
    assert any(n.startswith("hidden_states.") for n in opt) and any(n.startswith("pooled.") for n in opt)
    assert isinstance(entry["fusions"], dict)
    assert all(isinstance(v, int) and v > 0 for v in entry["fusions"].values())


def test_int8_records_per_layer_cosine_and_keeps_pooling_fp32(export_dir):
    import onnx

    from layerscope.export.variants import make_variant

    entry = make_variant(export_dir, "int8")
    layers = [k for k in entry["parity"]["outputs"] if k.startswith("hidden_states.")]
    assert len(layers) == _manifest(export_dir)["num_layers"] + 1
    graph = onnx.load(str(export_dir / entry["file"])).graph
    pool_ops = {n.op_type for n in graph.node if n.name.startswith("layerscope/")}
    assert "MatMulInteger" not in pool_ops and "DynamicQuantizeLinear" not in pool_ops
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in graph.node)
    assert entry["details"]["quantized_nodes"] > 0


def test_engine_runs_a_variant_and_matches_fp32(export_dir):
    from layerscope.engines.base import create_engine
    from layerscope.export.variants import make_variant
    from layerscope.runtime.pipeline import embed

    make_variant(export_dir, "opt")
    texts = ["a quick test", "the dog plays in the snow near the lake", "hi"]
    ref = embed(str(export_dir), texts, engine="ort", layers="all")
    eng = create_engine("ort", str(export_dir), variant="opt")
    assert eng.info.notes and "opt" in eng.info.notes[0]
    got = embed(str(export_dir), texts, engine=eng, layers="all")
    for key in ref:
        np.testing.assert_allclose(got[key], ref[key], atol=1e-4)


def test_token_level_pooling_matches_in_graph(export_dir):
    from layerscope.engines.base import create_engine
    from layerscope.runtime.pipeline import embed

    texts = ["one", "two words here", "a somewhat longer sentence with more tokens in it"]
    a = embed(str(export_dir), texts, engine=create_engine("ort", str(export_dir)), poolings=["mean", "max"])
    b = embed(str(export_dir), texts, engine=create_engine("ort", str(export_dir), in_graph_pooling=False),
              poolings=["mean", "max"])
    for key in a:
        np.testing.assert_allclose(a[key], b[key], atol=1e-5)


def test_bad_variant_names_give_clear_errors(export_dir):
    from layerscope.errors import InputError
    from layerscope.export.variants import check_kind, variant_onnx_file

    with pytest.raises(InputError, match="bf16"):
        check_kind("bf16")
    with pytest.raises(InputError, match="did you mean 'int8'"):
        check_kind("int9")
    with pytest.raises(InputError, match="inspect optimize"):
        variant_onnx_file({"variants": {}}, "fp16")
