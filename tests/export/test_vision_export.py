"""Vision towers exported with every hidden state: each layer, the in-graph poolings over the patches and the
joint image embedding held to plain transformers on ort, ov and torch, for every vision family at several
image sizes (tiny random checkpoints from transformers config classes: tests/tiny_vision.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision, hf_vision_reference  # noqa: E402

from layerscope.errors import InputError  # noqa: E402
from layerscope.model.source import resolve_source

# (kind, tower, image size, patch size, tokens before the patches: CLS and DINOv2's two registers)
# one size of each family in the quick loop, a second one (another grid) under -m slow
CASES = [
    ("vit", None, 16, 4, 1),
    ("vit", None, 24, 8, 1),
    ("dinov2", None, 16, 4, 3),
    pytest.param(("dinov2", None, 28, 7, 3), marks=pytest.mark.slow),
    ("clip", "vision", 16, 4, 1),
    pytest.param(("clip-vision", None, 32, 8, 1), marks=pytest.mark.slow),
    ("siglip", "vision", 16, 4, 0),
    pytest.param(("siglip-vision", None, 24, 6, 0), marks=pytest.mark.slow),
]
FAMILY = {"vit": "vit", "dinov2": "dinov2", "clip": "clip-vision", "clip-vision": "clip-vision",
          "siglip": "siglip-vision", "siglip-vision": "siglip-vision"}


def _images(n: int, seed: int = 1):
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(40, 30), (17, 50), (64, 64), (33, 21)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for h, w in sizes[:n]]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[2]}px")
def exported(request, tmp_path_factory):
    from layerscope.export.exporter import export_model

    kind, tower, size, patch, prefix = request.param
    root = tmp_path_factory.mktemp(f"{kind}{size}")
    ckpt = build_tiny_vision(kind, root / "ckpt", image_size=size, patch_size=patch)
    manifest = export_model(resolve_source(str(ckpt)), root / "export", tower=tower)
    return kind, ckpt, root / "export", manifest, prefix


def test_vision_export_records_parity_of_every_layer(exported):
    """Catches: a layer, a pooling or the joint embedding missing from the graph or from the recorded check."""
    kind, _, _, manifest, prefix = exported
    assert manifest.family == FAMILY[kind] and manifest.modality == "image"
    assert manifest.image.prefix_tokens == prefix
    layers = [f"hidden_states.{i}" for i in range(3)]
    pooled = ["pooled.mean"] + (["pooled.cls"] if prefix else [])
    joint = ["image_embeds"] if kind != "vit" and kind != "dinov2" else []
    assert set(manifest.parity.outputs) == set(layers + pooled + joint)
    for name, check in manifest.parity.outputs.items():
        assert check.max_abs <= check.tolerance, name
        assert check.min_cos > 0.99999, name


@pytest.mark.parametrize("engine", ["ort", "ov", "torch"])
def test_vision_layers_match_transformers(exported, engine):
    """Catches: a layer off by one, the register tokens counted in the patch mean, CLS taken from the wrong
    token, the projection left out of the joint embedding, the image processor not the checkpoint's own."""
    from transformers import AutoImageProcessor

    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    kind, ckpt, export_dir, manifest, prefix = exported
    images = _images(3)
    pixels = AutoImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="np")["pixel_values"]
    ref_hidden, ref_embeds = hf_vision_reference(kind, ckpt, pixels.astype(np.float32))
    eng = create_engine(engine, ModelHandle.resolve(export_dir))
    batch = eng.image_encoder()(images)
    np.testing.assert_array_equal(batch.inputs["pixel_values"], pixels.astype(np.float32))
    layers = [str(i) for i in range(len(ref_hidden))]
    states = eng.run_tokens(batch, layers)
    for layer, got, ref in zip(layers, states, ref_hidden):
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-4, err_msg=f"{kind} layer {layer} on {engine}")
    modes = ["mean"] + (["cls"] if prefix else [])
    pooled = eng.run(batch, layers, modes)
    stacked = np.stack(ref_hidden).astype(np.float64)
    np.testing.assert_allclose(pooled["mean"], stacked[:, :, prefix:, :].mean(axis=2), atol=2e-5, rtol=1e-4)
    if prefix:
        np.testing.assert_allclose(pooled["cls"], stacked[:, :, 0, :], atol=2e-5, rtol=1e-4)
    embeds = eng.pooled_output(batch)
    if ref_embeds is None:
        assert embeds is None
    else:
        np.testing.assert_allclose(embeds, ref_embeds, atol=2e-5, rtol=1e-4)


def test_siglip_has_no_cls_pooling(tmp_path):
    """Catches: a CLS pooling over SigLIP's first patch (it has no CLS token)."""
    from layerscope.export.exporter import export_model

    ckpt = build_tiny_vision("siglip-vision", tmp_path / "ckpt")
    with pytest.raises(InputError, match="no CLS token"):
        export_model(resolve_source(str(ckpt)), tmp_path / "export", pooled=["cls"])
    assert not (tmp_path / "export").exists()


def test_two_tower_needs_a_known_tower(tmp_path):
    """Catches: a two-tower checkpoint read as the wrong tower, or a mistyped tower accepted."""
    from layerscope.export.exporter import export_model
    from layerscope.model.families import family_for

    assert family_for("clip").name == "clip-text"
    assert family_for("clip", "vision").name == "clip-vision"
    with pytest.raises(InputError, match="unknown tower 'visoin'"):
        family_for("clip", "visoin")
    with pytest.raises(InputError, match="no vision tower"):
        family_for("bert", "vision")
    ckpt = build_tiny_vision("siglip", tmp_path / "ckpt")
    with pytest.raises(InputError, match="--tower vision"):
        export_model(resolve_source(str(ckpt)), tmp_path / "export")


def test_vision_checkpoint_without_processor_is_one_line(tmp_path):
    """Catches: a vision checkpoint without its image processor exported with a guessed preprocessing."""
    from layerscope.export.exporter import export_model

    ckpt = build_tiny_vision("vit", tmp_path / "ckpt")
    (ckpt / "preprocessor_config.json").unlink()
    with pytest.raises(InputError, match="preprocessor_config.json"):
        export_model(resolve_source(str(ckpt)), tmp_path / "export")


def test_torch_runs_a_plain_vision_checkpoint(tmp_path):
    """Catches: a plain vision checkpoint described as a text model (asked for a tokenizer), or its torch
    engine pooling the register tokens into the patch mean."""
    from transformers import AutoImageProcessor

    from layerscope.engines.base import create_engine

    ckpt = build_tiny_vision("dinov2", tmp_path / "ckpt")
    images = _images(2)
    eng = create_engine("torch", str(ckpt), device="cpu")
    assert eng.manifest.modality == "image" and eng.manifest.image.prefix_tokens == 3
    pixels = AutoImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="np")["pixel_values"]
    hidden, _ = hf_vision_reference("dinov2", ckpt, pixels.astype(np.float32))
    got = eng.run(eng.image_encoder()(images), ["1", "2"], ["mean"])["mean"]
    np.testing.assert_allclose(got, np.stack(hidden[1:]).astype(np.float64)[:, :, 3:].mean(axis=2),
                               atol=2e-5, rtol=1e-4)
