"""``export --dtype fp16`` of a vision tower: an fp16 graph (weights in fp16, float32 pixels in and vectors
out) whose every output keeps its depth's cosine to plain transformers in fp32, the parity recorded."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision, hf_vision_reference  # noqa: E402


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    """The smallest cosine over token vectors; a zero reference vector (DINOv2's registers start at zero)
    must come out zero."""
    a, b = a.reshape(-1, a.shape[-1]).astype(np.float64), b.reshape(-1, b.shape[-1]).astype(np.float64)
    zero = np.linalg.norm(a, axis=-1) == 0
    assert np.abs(b[zero]).max(initial=0.0) == 0.0
    a, b = a[~zero], b[~zero]
    return float(((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))).min())


@pytest.mark.parametrize("kind,tower", [("dinov2", None), pytest.param("clip", "vision", marks=pytest.mark.slow)])
def test_fp16_vision_export_keeps_every_layer_and_records_its_parity(kind, tower, tmp_path):
    """Catches: an 'fp16' export that is fp32 inside (nothing gained), one whose outputs drift from the fp32
    model past the depth budget, parity not recorded in the manifest, an fp16 graph that wants fp16 pixels."""
    import json

    import onnx
    from PIL import Image
    from transformers import AutoImageProcessor

    from layerscope.engines.base import create_engine
    from layerscope.export.exporter import export_model
    from layerscope.export.half import fp16_min_cos
    from layerscope.model.handle import ModelHandle
    from layerscope.model.source import resolve_source

    ckpt = build_tiny_vision(kind, tmp_path / "ckpt")
    export_model(resolve_source(str(ckpt)), tmp_path / "fp32", tower=tower)
    export_model(resolve_source(str(ckpt)), tmp_path / "fp16", tower=tower, dtype="fp16")
    man = json.loads((tmp_path / "fp16" / "manifest.json").read_text())
    assert man["precision"] == "fp16" and man["fp16_nodes_kept_fp32"] > 0
    outputs = man["parity"]["outputs"]
    assert set(outputs) >= {"hidden_states.0", "hidden_states.2", "pooled.mean"}
    for name, stats in outputs.items():
        assert stats["min_cos"] >= man["parity"]["tolerance_fp16"]["min_cos"][name] and stats["max_abs"] > 0, name

    graph = onnx.load(str(tmp_path / "fp16" / "model.onnx"))
    count = {kind: sum(int(np.prod(t.dims)) for t in graph.graph.initializer if t.data_type == kind)
             for kind in (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT)}
    assert count[onnx.TensorProto.FLOAT16] > 20 * count[onnx.TensorProto.FLOAT]  # the weights are fp16
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT

    rng = np.random.default_rng(5)
    images = [Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8), "RGB") for _ in range(3)]
    pixels = AutoImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="np")["pixel_values"]
    hidden, _ = hf_vision_reference(kind, ckpt, pixels.astype(np.float32))
    half = create_engine("ort", ModelHandle.resolve(tmp_path / "fp16"))
    full = create_engine("ort", ModelHandle.resolve(tmp_path / "fp32"))
    layers = [str(i) for i in range(len(hidden))]
    got = half.run_tokens(half.image_encoder()(images), layers)
    ref32 = full.run_tokens(full.image_encoder()(images), layers)
    for i, (h, g, f) in enumerate(zip(hidden, got, ref32)):
        assert g.dtype == np.float32
        assert _cos(h, g) >= fp16_min_cos(f"hidden_states.{i}", len(hidden) - 1), i
        assert not np.allclose(g, f, atol=1e-6)  # it is not the fp32 graph


def test_fp16_vision_export_gets_an_fp16_attention_graph_held_to_fp32(tmp_path):
    """Catches: an fp16 export's attention graph traced in fp32 (twice the weights, and not what the export
    computes), one whose probabilities drift from the fp32 eager model past its recorded tolerance, one that
    wants fp16 pixels, and parity not recorded against fp32."""
    import onnx
    import torch
    import transformers as t
    from PIL import Image

    from layerscope.export.attention_run import AttentionRunner
    from layerscope.export.attention_variant import make_attention_variant
    from layerscope.export.exporter import export_model
    from layerscope.export.vision_attention import ATOL_FP16
    from layerscope.model.source import resolve_source

    ckpt = build_tiny_vision("dinov2", tmp_path / "ckpt")
    export_model(resolve_source(str(ckpt)), tmp_path / "fp16", dtype="fp16")
    entry = make_attention_variant(tmp_path / "fp16")
    assert entry["precision"] == "fp16" and entry["details"]["fp16_nodes_kept_fp32"] > 0
    assert entry["tolerance"]["max_abs"] == ATOL_FP16 and entry["tolerance"]["reference"] == "torch fp32"
    outputs = entry["parity"]["outputs"]
    assert {"attentions.1", "attentions.2", "attention.entropy"} <= set(outputs)
    assert all(s["max_abs"] <= s["tolerance"] for s in outputs.values())
    assert max(s["max_abs"] for s in outputs.values()) > 1e-6  # computed in fp16, not the fp32 graph

    graph = onnx.load(str(tmp_path / "fp16" / "model.attn.onnx"))
    count = {k: sum(int(np.prod(x.dims)) for x in graph.graph.initializer if x.data_type == k)
             for k in (onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT)}
    assert count[onnx.TensorProto.FLOAT16] > 20 * count[onnx.TensorProto.FLOAT]
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert all(o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for o in graph.graph.output)

    rng = np.random.default_rng(7)
    images = [Image.fromarray(rng.integers(0, 256, (30, 40, 3), dtype=np.uint8), "RGB") for _ in range(3)]
    pixels = t.AutoImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="np")["pixel_values"]
    model = t.Dinov2WithRegistersModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(pixel_values=torch.from_numpy(pixels), output_attentions=True).attentions
    got = AttentionRunner(tmp_path / "fp16", "ort").run({"pixel_values": pixels.astype(np.float32)},
                                                       patterns=True).patterns
    for layer, a in enumerate(want):
        np.testing.assert_allclose(got[:, layer], a.numpy(), atol=ATOL_FP16, err_msg=f"layer {layer + 1}")
        np.testing.assert_allclose(got[:, layer].sum(-1), 1.0, atol=ATOL_FP16)  # each query's row a distribution
