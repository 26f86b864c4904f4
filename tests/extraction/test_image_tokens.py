"""Image stores at token level (every token of every image with its grid position), resuming an interrupted
image extraction, and a vision checkpoint exported through the export cache."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision, hf_vision_reference  # noqa: E402

from layerscope.errors import StoreError  # noqa: E402

N, SIZE, PATCH = 5, 16, 4


def _images():
    from PIL import Image

    rng = np.random.default_rng(3)
    return [Image.fromarray(rng.integers(0, 256, (20 + 3 * i, 24, 3)).astype(np.uint8), "RGB") for i in range(N)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("image_tokens")
    ckpt = build_tiny_vision("dinov2", root / "ckpt", image_size=SIZE, patch_size=PATCH)
    export = root / "export"
    export_model(resolve_source(str(ckpt)), export)
    folder = root / "photos"
    folder.mkdir()
    images = _images()
    for i, im in enumerate(images):
        im.save(folder / f"p{i}.png")
    return root, ckpt, export, folder, images


def _pixels(ckpt, images):
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="np")["pixel_values"].astype(np.float32)


def test_token_store_holds_every_token_with_its_grid_position(setup):
    """Catches: tokens of one image written into another's rows, a wrong grid (row and column swapped,
    registers counted as patches), CLS/register tokens not marked, pooled rows unlike a pooled-only run,
    the torch engine unable to pool an image batch's tokens, grid.npy outside the store's checksums."""
    import transformers

    from layerscope.extraction.image_extract import extract_images
    from layerscope.store.store import LayerStore

    root, ckpt, export, folder, images = setup
    extract_images(export, folder, root / "tok", tokens=True, workers=0, batch_size=2)
    extract_images(export, folder, root / "tok_torch", tokens=True, workers=0, batch_size=3, engine="torch")
    extract_images(export, folder, root / "plain", workers=0, batch_size=4)
    store, by_torch, plain = (LayerStore.open(root / s) for s in ("tok", "tok_torch", "plain"))
    hidden, _ = hf_vision_reference("dinov2", ckpt, _pixels(ckpt, images))
    rows = cols = SIZE // PATCH
    per_image = 1 + 2 + rows * cols  # CLS, two registers, the patch grid
    for layer in ("0", "2"):
        tok = store.tokens(layer)
        assert len(tok) == N and tok.total_tokens == N * per_image
        for i in range(N):
            np.testing.assert_allclose(tok.text(i), hidden[int(layer)][i], atol=2e-5, rtol=1e-4)
            np.testing.assert_allclose(by_torch.tokens(layer).text(i), hidden[int(layer)][i], atol=2e-5, rtol=1e-4)
        for pooling in ("cls", "mean"):
            np.testing.assert_array_equal(store[pooling, layer], plain[pooling, layer])
            np.testing.assert_allclose(by_torch[pooling, layer], plain[pooling, layer], atol=2e-5, rtol=1e-4)
    tok = store.tokens(0)
    strings = tok.strings()
    one = [strings[int(t)] for t in tok.ids[:per_image]]
    assert one == ["<cls>", "<register>", "<register>"] + ["<patch>"] * (rows * cols)
    assert tok.special[:per_image].tolist() == [1, 1, 1] + [0] * (rows * cols)
    grid = np.asarray(tok.grid())
    assert grid.shape == (N * per_image, 2) and (grid[:3] == -1).all()
    # the grid is where the patch sits: layer 0 minus its position embedding is the patch embedding
    # (a convolution) of exactly that patch of pixels, computed here by hand
    model = transformers.Dinov2WithRegistersModel.from_pretrained(ckpt).eval()
    conv = model.embeddings.patch_embeddings.projection
    weight, bias = conv.weight.detach().numpy(), conv.bias.detach().numpy()
    position = model.embeddings.position_embeddings.detach().numpy()[0, 1:]  # [patches, hidden]
    pixels = _pixels(ckpt, images)
    for i in (0, N - 1):
        vectors = tok.text(i)
        for k in range(3, per_image):  # every patch: off the diagonal too
            r, c = grid[i * per_image + k]
            patch = pixels[i, :, r * PATCH:(r + 1) * PATCH, c * PATCH:(c + 1) * PATCH]
            by_hand = np.einsum("ochw,chw->o", weight, patch) + bias
            np.testing.assert_allclose(vectors[k] - position[r * cols + c], by_hand, atol=1e-4)
    checked, problems = LayerStore.verify(root / "tok")
    assert not problems and checked >= 1
    np.save(root / "tok" / "tokens" / "grid.npy", np.zeros_like(grid))
    assert any("grid.npy" in p for p in LayerStore.verify(root / "tok")[1])
    with pytest.raises(StoreError, match="text tokens: they have spans"):
        _text_store_grid(root)


def _text_store_grid(root):
    from layerscope.store.token_store import TokenLayer, TokenSection

    fake = root / "text_tokens"
    (fake / "tokens").mkdir(parents=True, exist_ok=True)
    for name in ("0.npy",):
        np.save(fake / "tokens" / name, np.zeros((2, 4), np.float32))
    for name, arr in (("offsets.npy", np.array([0, 2])), ("ids.npy", np.zeros(2, np.int32)),
                      ("special.npy", np.zeros(2, np.uint8)), ("spans.npy", np.zeros((2, 2), np.int32))):
        np.save(fake / "tokens" / name, arr)
    return TokenLayer(fake, TokenSection(["0"], 2, "float32", 4), "0").grid()


def test_an_interrupted_image_extraction_resumes_without_computing_a_row_twice(setup, monkeypatch):
    """Catches: a resumed run redoing finished rows or skipping unfinished ones, token rows of the resumed
    part landing elsewhere, resuming with other layers or from changed images accepted."""
    from layerscope.extraction import image_extract
    from layerscope.extraction.image_extract import extract_images
    from layerscope.store.store import LayerStore

    root, _, export, folder, _ = setup
    out = root / "resumed"
    real_commit = LayerStore.commit
    calls = []

    def dying_commit(self, index):
        calls.append(len(index))
        if len(calls) == 2:
            raise KeyboardInterrupt  # killed after one batch was marked done
        real_commit(self, index)

    monkeypatch.setattr(LayerStore, "commit", dying_commit)
    with pytest.raises(KeyboardInterrupt):
        extract_images(export, folder, out, tokens=True, workers=0, batch_size=2)
    monkeypatch.setattr(LayerStore, "commit", real_commit)
    half = LayerStore.open(out, allow_incomplete=True)
    assert not half.complete and half.done_mask().tolist() == [1, 1, 0, 0, 0]

    with pytest.raises(StoreError, match="layers="):
        extract_images(export, folder, out, tokens=True, workers=0, batch_size=2, layers="last", resume=True)
    seen = []
    real_pixels = image_extract._pixels
    monkeypatch.setattr(image_extract, "_pixels",  # each batch's (name, payload) pairs
                        lambda items: (seen.extend(p for _, p in items), real_pixels(items))[1])
    report = extract_images(export, folder, out, tokens=True, workers=0, batch_size=2, resume=True)
    assert report.computed == 3 and sorted(Path(p).name for p in seen) == ["p2.png", "p3.png", "p4.png"]
    extract_images(export, folder, root / "straight", tokens=True, workers=0, batch_size=5)
    done, straight = LayerStore.open(out), LayerStore.open(root / "straight")
    for layer in ("0", "1", "2"):
        np.testing.assert_allclose(done.tokens(layer).rows(), straight.tokens(layer).rows(), atol=1e-6)
        for pooling in ("cls", "mean"):
            np.testing.assert_allclose(done[pooling, layer], straight[pooling, layer], atol=1e-6)
    assert not LayerStore.verify(out)[1]
    seen.clear()
    assert extract_images(export, folder, out, tokens=True, workers=0, resume=True).computed == 0 and not seen

    _images()[0].rotate(90).save(folder / "p0.png")
    try:
        with pytest.raises(StoreError, match="other images"):
            extract_images(export, folder, out, tokens=True, workers=0, resume=True)
    finally:
        _images()[0].save(folder / "p0.png")


def test_a_vision_checkpoint_is_exported_once_into_the_cache(setup, tmp_path, monkeypatch):
    """Catches: a vision checkpoint refused by extract-images, or exported again on every run."""
    from layerscope.export import vision_export
    from layerscope.extraction.image_extract import extract_images
    from layerscope.store.store import LayerStore

    root, ckpt, export, folder, _ = setup
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    exports = []
    real = vision_export.export_vision
    monkeypatch.setattr(vision_export, "export_vision", lambda *a, **k: (exports.append(a[1]), real(*a, **k))[1])
    extract_images(ckpt, folder, tmp_path / "a", workers=0)
    extract_images(ckpt, folder, tmp_path / "b", workers=0)
    assert len(exports) == 1 and Path(exports[0]).is_relative_to(tmp_path / "home")
    extract_images(export, folder, tmp_path / "c", workers=0)
    a, by_export = LayerStore.open(tmp_path / "b"), LayerStore.open(tmp_path / "c")
    np.testing.assert_array_equal(a["mean", "2"], by_export["mean", "2"])


def test_extract_images_command_passes_tokens_and_resume(setup, tmp_path, capsys):
    """Catches: --tokens or --resume accepted by the command but not handed to the extraction."""
    from cli_helpers import run_cli

    from layerscope.store.store import LayerStore

    _, _, export, folder, _ = setup
    args = ["extract-images", export, folder, "--out", tmp_path / "s", "--workers", "0", "--layers", "last"]
    code, text = run_cli([*args, "--tokens", "--store-dtype", "float16"], capsys)
    assert code == 0, text
    store = LayerStore.open(tmp_path / "s")
    assert store.token_layers == ["2"] and store.tokens(-1).section.dtype == "float16"
    code, text = run_cli([*args, "--tokens", "--store-dtype", "float16", "--resume"], capsys)
    assert code == 0 and "(0 run now)" in text, text
    code, text = run_cli([*args, "--resume"], capsys)
    assert code == 2 and "was made with tokens=" in text and "Traceback" not in text
