"""Variants (opt, int8, fp16, ov-*) of an export whose weights live in external data (threshold lowered)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from layerscope.export import exporter, external

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today"]


@pytest.fixture(scope="module")
def exports(tiny_model, tiny_export, tmp_path_factory):
    """The same tiny BERT exported twice: one file, and with its weights in model.onnx_data."""
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("variants-external")
    tiny_export("bert", pooled=["mean"], to=root / "small")
    before = exporter.EXTERNAL_DATA_BYTES
    exporter.EXTERNAL_DATA_BYTES = 10_000
    try:
        assert export_model(resolve_source(str(tiny_model("bert"))), root / "big", pooled=["mean"]).external_data
    finally:
        exporter.EXTERNAL_DATA_BYTES = before
    return root / "small", root / "big"


def _run(export_dir, file):
    from layerscope.model.tokenize import Encoder
    from layerscope.engines.ort_session import make_session
    from layerscope.model.handle import ModelHandle

    session = make_session(export_dir / file, "CPUExecutionProvider")
    batch = Encoder(ModelHandle.resolve(export_dir).tokenizer(), [i.name for i in session.get_inputs()], 64)(TEXTS)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {i.name: batch.inputs[i.name] for i in session.get_inputs()})))


@pytest.mark.parametrize("kind", ["opt", "int8", "fp16"])
def test_variant_of_an_external_data_export(exports, kind):
    """Catches: the old refusal ('made for single-file exports only'), a variant written as one file
    (inline weights) or with its data elsewhere, a variant whose data file is not hashed in the manifest,
    and a transform that sees different weights than the single-file export's (outputs must be equal)."""
    from layerscope.model.manifest_verify import verify_export_files
    from layerscope.export.variants import make_variant

    small, big = exports
    ref = make_variant(small, kind)
    entry = make_variant(big, kind)
    data = f"model.{kind}.onnx_data"
    assert ref["external_data"] is None
    assert list(entry["external_data"]) == [data]
    graph = onnx.load(str(big / entry["file"]), load_external_data=False)
    assert [p.name for p in external.data_files(big / entry["file"])] == [data]
    assert external.inline_bytes(graph) < 10_000
    manifest = json.loads((big / "manifest.json").read_text())
    assert set(manifest["variants"][kind]["parity"]["outputs"]) == set(manifest["outputs"])  # per layer
    assert entry["parity"]["outputs"].keys() == ref["parity"]["outputs"].keys()
    assert entry["fusions"] == ref["fusions"]  # the streamed graph blocks no fusion
    a, b = _run(small, ref["file"]), _run(big, entry["file"])
    for name in a:  # opt: fused kernels may sum in another order on the renamed graph (observed 7e-7)
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-5 if kind == "opt" else 0, err_msg=f"{kind} {name}")
    checked, problems = verify_export_files(big)
    assert not problems
    raw = bytearray((big / data).read_bytes())
    raw[-1] ^= 0xFF
    (big / data).write_bytes(bytes(raw))
    try:
        assert any(data in p for p in verify_export_files(big)[1])
    finally:
        raw[-1] ^= 0xFF
        (big / data).write_bytes(bytes(raw))


def test_failed_variant_of_an_external_data_export_leaves_nothing(exports):
    from layerscope.errors import ExportError
    from layerscope.export.variants import make_variant

    _, big = exports
    with pytest.raises(ExportError, match="tolerance"):
        make_variant(big, "fp16", force=True, tolerance={"min_cos": 1.0, "max_abs": 0.0})
    assert not (big / "model.fp16.onnx").exists() and not (big / "model.fp16.onnx_data").exists()
    # the forced remake replaced the recorded fp16 variant: its entry goes too, so the export still verifies
    from layerscope.model.manifest_verify import verify_export_files

    assert "fp16" not in json.loads((big / "manifest.json").read_text()).get("variants", {})
    assert not verify_export_files(big)[1]


def test_openvino_precision_of_an_external_data_export(exports):
    pytest.importorskip("openvino")
    from layerscope.export.variants import make_variant

    _, big = exports
    entry = make_variant(big, "ov-fp32")
    assert entry["file"] == "model.onnx" and entry["engine"] == "ov"
    assert all(s["max_abs"] <= 1e-4 for s in entry["parity"]["outputs"].values())


def test_openvino_int8_of_an_external_data_export_matches_the_single_file_one(exports):
    """Catches: ov-int8 reading the int8 graph without its model.int8.onnx_data (OpenVINO resolves external
    data next to the file it reads), a different verdict or different figures than the single-file export's
    (same weights, so the same quantized model), and an int8 data file that is not hashed in the manifest."""
    pytest.importorskip("openvino")
    from layerscope.errors import ExportError
    from layerscope.export.variants import make_variant
    from layerscope.model.manifest_verify import verify_export_files

    small, big = exports
    outcome = {}
    for name, export_dir in (("small", small), ("big", big)):
        try:
            outcome[name] = make_variant(export_dir, "ov-int8", force=True)
        except ExportError as exc:  # refused for its tolerance: then refused alike, and nothing recorded
            assert "outside its tolerance" in str(exc)
            assert "ov-int8" not in json.loads((export_dir / "manifest.json").read_text()).get("variants", {})
            outcome[name] = None
    assert (outcome["small"] is None) == (outcome["big"] is None)
    if outcome["big"] is None:
        return
    a, b = outcome["small"]["parity"]["outputs"], outcome["big"]["parity"]["outputs"]
    assert a.keys() == b.keys()
    for name in a:
        assert b[name]["min_cos"] == pytest.approx(a[name]["min_cos"], abs=1e-5), name
    recorded = json.loads((big / "manifest.json").read_text())["variants"]["ov-int8"]
    assert recorded["file"] == "model.int8.onnx" and (big / "model.int8.onnx_data").exists()
    assert not verify_export_files(big)[1]
    data = big / "model.int8.onnx_data"  # hashed: a flipped byte is reported by name
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    try:
        assert any("model.int8.onnx_data" in p for p in verify_export_files(big)[1])
    finally:
        raw[-1] ^= 0xFF
        data.write_bytes(bytes(raw))
