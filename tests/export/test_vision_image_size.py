"""``export --image-size``: a vision tower exported at another image size than its checkpoint's, its position
embeddings resized as transformers resizes them (``interpolate_pos_encoding``), every layer held to plain
transformers at that size on ort, ov and torch; and one line, before any work, for a size it cannot serve.
Tiny random checkpoints at 16x16 pixels in 4x4 patches (tests/tiny_vision.py); their own size is covered by
test_vision_export.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision, hf_vision_reference  # noqa: E402

from layerscope.errors import InputError  # noqa: E402
from layerscope.model.source import resolve_source  # noqa: E402

# (kind, tower, (height, width), tokens before the patches); one other size per family in the quick loop,
# a second one (smaller, or not square) under -m slow
CASES = [
    ("vit", None, (24, 24), 1),
    pytest.param(("vit", None, (12, 20), 1), marks=pytest.mark.slow),
    ("dinov2", None, (12, 20), 3),
    pytest.param(("dinov2", None, (32, 32), 3), marks=pytest.mark.slow),
    ("clip", "vision", (24, 24), 1),
    pytest.param(("clip-vision", None, (16, 28), 1), marks=pytest.mark.slow),
    ("siglip-vision", None, (20, 28), 0),
    pytest.param(("siglip", "vision", (8, 8), 0), marks=pytest.mark.slow),
]


def _processor_by_hand(kind: str, height: int, width: int):
    """The image processor a user would write for the tiny checkpoint at ``height`` x ``width`` (the
    checkpoint's at 16 pixels: tests/tiny_vision.py), made here from transformers, not by layerscope."""
    import transformers as t

    size = {"height": height, "width": width}
    if kind == "vit":
        return t.ViTImageProcessor(size=size)
    if kind == "dinov2":
        return t.ViTImageProcessor(size=size, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    if kind in ("clip", "clip-vision"):  # shortest edge 16 for a 16x16 crop: the edge grows with the crop
        return t.CLIPImageProcessor(size={"shortest_edge": max(height, width)}, crop_size=size)
    return t.SiglipImageProcessor(size=size)


def _images(n: int, seed: int = 3):
    from PIL import Image

    rng = np.random.default_rng(seed)
    sizes = [(40, 30), (17, 50), (64, 64)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for h, w in sizes[:n]]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[2][0]}x{c[2][1]}")
def resized(request, tmp_path_factory):
    from layerscope.export.exporter import export_model

    kind, tower, size, prefix = request.param
    root = tmp_path_factory.mktemp(f"{kind}{size[0]}x{size[1]}")
    ckpt = build_tiny_vision(kind, root / "ckpt")
    manifest = export_model(resolve_source(str(ckpt)), root / "export", tower=tower, image_size=size)
    return kind, ckpt, root / "export", manifest, size, prefix


def test_resized_export_records_its_size_and_parity(resized):
    """Catches: an export at another size that records the checkpoint's size or token count (the store's patch
    grid would be wrong), or that is written without its every output checked."""
    kind, _, _, manifest, (h, w), prefix = resized
    image = manifest.image
    assert (image.height, image.width) == (h, w)
    assert image.tokens == (h // 4) * (w // 4) + prefix
    assert manifest.raw["image"]["checkpoint_size"] == [16, 16]
    assert manifest.raw["parity"]["image_size"] == [h, w]
    assert {f"hidden_states.{i}" for i in range(3)} <= set(manifest.parity.outputs)
    for name, check in manifest.parity.outputs.items():
        assert check.max_abs <= check.tolerance and check.min_cos > 0.99999, name


@pytest.mark.parametrize("engine", ["ort", "torch", pytest.param("ov", marks=pytest.mark.slow)])
def test_resized_layers_match_transformers_at_that_size(resized, engine):
    """Catches: position embeddings left at the checkpoint's grid or resized another way than transformers
    (bicubic, DINOv2's antialiased), a processor still giving the checkpoint's size, the torch engine reading
    the new size without resizing (transformers refuses it), a layer or the joint embedding off."""
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    kind, ckpt, export_dir, _, (h, w), prefix = resized
    images = _images(3)
    pixels = _processor_by_hand(kind, h, w)(images=images, return_tensors="np")["pixel_values"].astype(np.float32)
    assert pixels.shape[-2:] == (h, w)
    ref_hidden, ref_embeds = hf_vision_reference(kind, ckpt, pixels, interpolate=True)
    eng = create_engine(engine, ModelHandle.resolve(export_dir))
    batch = eng.image_encoder()(images)
    np.testing.assert_allclose(batch.inputs["pixel_values"], pixels, atol=1e-6)
    layers = [str(i) for i in range(len(ref_hidden))]
    for layer, got, ref in zip(layers, eng.run_tokens(batch, layers), ref_hidden):
        assert got.shape == ref.shape == (3, (h // 4) * (w // 4) + prefix, 32)
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-4, err_msg=f"{kind} layer {layer} on {engine}")
    mean = eng.run(batch, layers, ["mean"])["mean"]
    np.testing.assert_allclose(mean, np.stack(ref_hidden).astype(np.float64)[:, :, prefix:].mean(axis=2),
                               atol=2e-5, rtol=1e-4)
    if ref_embeds is not None:
        np.testing.assert_allclose(eng.pooled_output(batch), ref_embeds, atol=2e-5, rtol=1e-4)


def test_resized_attention_graph_matches_transformers(resized):
    """Catches: the attention graph traced at the checkpoint's size, or without the resized positions, beside
    an export at another size (its CLS maps would be drawn on the wrong grid)."""
    import torch
    import transformers as t

    from layerscope.export.attention_run import AttentionRunner
    from layerscope.export.attention_variant import make_attention_variant

    kind, ckpt, export_dir, _, (h, w), prefix = resized
    if kind not in ("vit", "dinov2"):
        pytest.skip("one attention graph per resizing path: ViT (the flag) and DINOv2 (always resized)")
    entry = make_attention_variant(export_dir)
    assert all(s["max_abs"] <= s["tolerance"] for s in entry["parity"]["outputs"].values())
    pixels = _processor_by_hand(kind, h, w)(images=_images(2), return_tensors="np")["pixel_values"].astype(np.float32)
    cls = t.ViTModel if kind == "vit" else t.Dinov2WithRegistersModel
    model = cls.from_pretrained(ckpt, attn_implementation="eager").eval()
    with torch.no_grad():
        want = model(pixel_values=torch.from_numpy(pixels), output_attentions=True,
                     **({"interpolate_pos_encoding": True} if kind == "vit" else {})).attentions
    got = AttentionRunner(export_dir, "ort").run({"pixel_values": pixels}, patterns=True).patterns
    assert got.shape[-1] == (h // 4) * (w // 4) + prefix
    for layer, a in enumerate(want):
        np.testing.assert_allclose(got[:, layer], a.numpy(), atol=1e-5, err_msg=f"layer {layer + 1}")


def test_cls_maps_lie_on_a_grid_wider_than_high(resized, tmp_path):
    """``run cls_attention`` on an export whose patch grid is 3 rows of 5 (DINOv2 at 12x20): each map is CLS's
    attention (mean over heads) on patch (r, c) at cell [r][c], as transformers' eager attention gives it.
    Catches: the map laid out with rows and columns swapped or cut with the wrong divisor (a square grid, as in
    test_cls_attention.py, cannot tell them apart)."""
    import io

    import torch
    import transformers as t
    from PIL import Image

    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.analyses.crossmodal import digit_pairs
    from layerscope.export.attention_variant import make_attention_variant

    kind, ckpt, export_dir, _, (h, w), prefix = resized
    if kind != "dinov2" or h == w:
        pytest.skip("one grid that is not square, on the family that always resizes its positions")
    n, rows, cols = 4, h // 4, w // 4
    make_attention_variant(export_dir)  # made once per export (the test above may have made it already)
    _, res = run_analysis("cls_attention", RunRequest(models=[str(export_dir)], engine="ort", out=tmp_path / "run",
                                                      options={"n": n, "bootstrap": 0}))
    (fig,) = res["per_model"].values()
    assert fig["summary"]["grid"] == [rows, cols] == [3, 5]
    images = [Image.open(io.BytesIO(png)).convert("RGB") for _, png, _ in digit_pairs(n)]
    pixels = _processor_by_hand(kind, h, w)(images=images, return_tensors="pt")["pixel_values"]
    model = t.Dinov2WithRegistersModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    with torch.no_grad():
        last = model(pixel_values=pixels, output_attentions=True).attentions[-1]
    cls_row = last[:, :, 0, prefix:].mean(1).numpy()  # [images, patches], patches row by row
    for i, shown in enumerate(fig["maps"]):
        want = [[cls_row[i, r * cols + c] for c in range(cols)] for r in range(rows)]
        np.testing.assert_allclose(np.array(shown["map"]), want, atol=1e-5, err_msg=f"image {i}")


def test_a_size_the_patches_do_not_tile_is_one_line_before_any_work(tmp_path):
    """Catches: a size the patch grid does not divide exported anyway (transformers would drop the pixels past
    the last whole patch without a word), or refused only after the export folder was made."""
    from layerscope.export.exporter import export_model

    ckpt = build_tiny_vision("vit", tmp_path / "ckpt")
    with pytest.raises(InputError, match=r"--image-size 30x24 is not a whole number of 4x4 patches"):
        export_model(resolve_source(str(ckpt)), tmp_path / "export", image_size=(30, 24))
    assert not (tmp_path / "export").exists()


def test_a_text_model_with_an_image_size_is_one_line(tiny_model, tmp_path):
    """Catches: --image-size dropped without a word on a text model."""
    from layerscope.export.exporter import export_model

    with pytest.raises(InputError, match="reads text: --image-size is for a vision tower"):
        export_model(resolve_source(str(tiny_model("bert"))), tmp_path / "export", image_size=(32, 32))
    assert not (tmp_path / "export").exists()


def test_export_command_refuses_an_untiled_size_in_one_line(tmp_path, capsys):
    """Catches: the CLI's --image-size not reaching the export, or its refusal printed as a traceback."""
    from cli_helpers import one_error, run_cli

    ckpt = build_tiny_vision("vit", tmp_path / "ckpt")
    code, text = run_cli(["export", ckpt, "--out", tmp_path / "export", "--image-size", "30x24"], capsys)
    one_error(code, text, "--image-size 30x24 is not a whole number of 4x4 patches")
    code, text = run_cli(["export", ckpt, "--out", tmp_path / "export", "--image-size", "30y24"], capsys)
    one_error(code, text, "--image-size '30y24': give pixels as 448")
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("text,want", [("448", (448, 448)), ("448x336", (448, 336)), ("32 X 48", (32, 48))])
def test_image_size_reads_square_or_height_by_width(text, want):
    from layerscope.model.vision import parse_image_size

    assert parse_image_size(text) == want


@pytest.mark.parametrize("text", ["0", "448x", "x448", "448x336x3", "big", "-4", "44.8"])
def test_an_unreadable_image_size_is_one_line(text):
    """Catches: a mistyped size read as something else (448x read as 448, a zero-pixel side)."""
    from layerscope.model.vision import parse_image_size

    with pytest.raises(InputError, match="give pixels as 448"):
        parse_image_size(text)


def test_a_center_cropping_processor_scales_its_resize_with_the_crop():
    """Catches: DINOv2's real processor (resize the shortest edge to 256, crop 224) set to 448 by the crop alone
    (it would pad a 256-pixel image out to 448) instead of resizing to 512 first, as the checkpoint's ratio."""
    import transformers as t
    from PIL import Image

    from layerscope.model.vision import processor_at_size

    real = t.BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224})
    got = processor_at_size(real, 448, 448, "dinov2")
    want = t.BitImageProcessor(size={"shortest_edge": 512}, crop_size={"height": 448, "width": 448})
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (300, 500, 3), dtype=np.uint8), "RGB")
    a = got(images=[image], return_tensors="np")["pixel_values"]
    np.testing.assert_array_equal(a, want(images=[image], return_tensors="np")["pixel_values"])
    assert a.shape == (1, 3, 448, 448) and real.crop_size["height"] == 224  # the checkpoint's is left as it was


def test_a_processor_that_keeps_each_image_own_shape_is_one_line():
    """Catches: a processor without a crop that keeps the aspect ratio (its pixels differ per image) set to a
    size it would not give."""
    import transformers as t

    from layerscope.model.vision import processor_at_size

    keeps_shape = t.CLIPImageProcessor(size={"shortest_edge": 16}, do_center_crop=False)
    with pytest.raises(InputError, match="cannot be set to give 24x24 pixels"):
        processor_at_size(keeps_shape, 24, 24, "ckpt")
