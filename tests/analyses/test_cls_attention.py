"""``run cls_attention``: a vision tower's attention graph held to transformers' eager attention, and the CLS
maps drawn over each image equal to the CLS row of transformers' own attentions, laid out on the patch grid."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision  # noqa: E402

from layerscope.errors import InputError  # noqa: E402

N = 6


@pytest.fixture(scope="module")
def dinov2(tmp_path_factory):
    from layerscope.export.attention_variant import make_attention_variant
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("cls_attention")
    ckpt = build_tiny_vision("dinov2", root / "ckpt")
    export_model(resolve_source(str(ckpt)), root / "export")
    entry = make_attention_variant(root / "export")
    return root, ckpt, entry


def test_vision_attention_graph_records_its_parity(dinov2):
    """Catches: an attention graph of a vision tower made without being checked, or checked on nothing."""
    _, _, entry = dinov2
    outputs = entry["parity"]["outputs"]
    assert {"attentions.1", "attentions.2", "attention.entropy"} <= set(outputs)
    assert all(s["max_abs"] <= s["tolerance"] for s in outputs.values()) and entry["details"]["heads"] == 4


@pytest.mark.parametrize("engine", ["ort", pytest.param("torch", marks=pytest.mark.slow)])
def test_cls_maps_equal_transformers_attention(dinov2, tmp_path, engine):
    """Catches: a map from another query than CLS, register tokens counted as patches, the grid laid out
    column-first, heads summed instead of averaged, a map drawn over another image than its own."""
    import transformers as t
    import torch
    from PIL import Image

    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.analyses.crossmodal import digit_pairs

    root, ckpt, _ = dinov2
    _, res = run_analysis("cls_attention", RunRequest(models=[str(root / "export")], engine=engine,
                                                      out=tmp_path / "run", options={"n": N, "bootstrap": 50}))
    (fig,) = res["per_model"].values()
    model = t.Dinov2WithRegistersModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    images = [Image.open(io.BytesIO(png)).convert("RGB") for _, png, _ in digit_pairs(N)]
    pixels = t.AutoImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        att = model(pixel_values=pixels, output_attentions=True).attentions
    last = att[-1][:, :, 0, 3:].mean(1).numpy()  # CLS query, patch keys after CLS and the two registers
    for i, shown in enumerate(fig["maps"]):
        np.testing.assert_allclose(np.array(shown["map"]), last[i].reshape(4, 4), atol=1e-5)
    rows = {r["layer"]: r for r in fig["tables"]["layers"]}
    for layer, a in enumerate(att, 1):
        share = a[:, :, 0, 3:].mean(1).sum(-1).numpy()
        assert rows[str(layer)]["share_on_patches"] == pytest.approx(float(share.mean()), abs=1e-5)
        assert rows[str(layer)]["share_on_patches_ci_low"] <= share.mean() <= rows[str(layer)]["share_on_patches_ci_high"]
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert page.count("<img src='data:image/png;base64,") == N and "CLS attention on the patches" in page


def test_cls_attention_needs_a_cls_token_and_an_attention_graph(tmp_path):
    """Catches: SigLIP (no CLS) read as if token 0 were one; an export without the attention graph run anyway."""
    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    sig = build_tiny_vision("siglip-vision", tmp_path / "sig")
    export_model(resolve_source(str(sig)), tmp_path / "sigx")
    with pytest.raises(InputError, match="with a CLS token"):
        run_analysis("cls_attention", RunRequest(models=[str(tmp_path / "sigx")], engine="ort", out=tmp_path / "a",
                                                 options={"n": 4}))
    vit = build_tiny_vision("vit", tmp_path / "vit")
    export_model(resolve_source(str(vit)), tmp_path / "vitx")
    with pytest.raises(InputError, match="has no attention graph"):
        run_analysis("cls_attention", RunRequest(models=[str(tmp_path / "vitx")], engine="ort", out=tmp_path / "b",
                                                 options={"n": 4}))
