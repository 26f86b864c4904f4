"""Image corpora into a LayerStore: a folder, a list file and a Hugging Face dataset of the same images give
the same vectors, each row is its own image's (held to plain transformers), ids and files are stored."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_vision import build_tiny_vision, hf_vision_reference  # noqa: E402

from layerscope.errors import InputError  # noqa: E402

N = 6


def _digit_images():
    """scikit-learn's bundled digits (8x8, 16 grey levels), scaled to 0..255 and to 24x24 pixels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8), "L").resize((24, 24), Image.NEAREST)
              for i in range(N)]
    return images, [int(t) for t in digits.target[:N]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("images")
    ckpt = build_tiny_vision("dinov2", root / "ckpt")
    export = root / "export"
    export_model(resolve_source(str(ckpt)), export)
    images, labels = _digit_images()
    folder = root / "digits"
    folder.mkdir()
    for i, im in enumerate(images):
        im.save(folder / f"digit_{i}.png")
    return root, ckpt, export, folder, images, labels


def test_folder_list_and_dataset_give_the_same_vectors(setup):
    """Catches: rows stored out of order, a worker's preprocessing unlike the in-process one, a dataset's
    images decoded differently from the same files, ids or files not stored."""
    import datasets
    from transformers import AutoImageProcessor

    from layerscope.extraction.image_extract import extract_images
    from layerscope.store.store import LayerStore

    root, ckpt, export, folder, images, _ = setup
    extract_images(export, folder, root / "s_folder", workers=1, batch_size=4)
    names = [f"digit_{i}.png" for i in range(N)]
    ds = datasets.Dataset.from_dict({"image": [im.convert("L") for im in images], "name": names},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "name": datasets.Value("string")}))
    extract_images(export, ds, root / "s_dataset", workers=0, batch_size=3, id_column="name")
    listing = root / "list.txt"
    listing.write_text("\n".join(f"digits/{n}" for n in reversed(names)) + "\n")
    extract_images(export, listing, root / "s_list", workers=0, batch_size=5)

    a, b, c = (LayerStore.open(root / s) for s in ("s_folder", "s_dataset", "s_list"))
    assert a.ids() == names and b.ids() == names
    assert c.ids() == [f"digits/{n}" for n in reversed(names)]
    assert [r["file"] for r in a.iter_records()] == [str(folder / n) for n in names]
    assert a.poolings == ["cls", "mean"] and a.layers == ["0", "1", "2"]
    for pooling in ("cls", "mean"):
        for layer in ("0", "2"):
            np.testing.assert_array_equal(a[pooling, layer], b[pooling, layer])
            np.testing.assert_array_equal(a[pooling, layer], c[pooling, layer][::-1])
    # each row is its own image's: plain transformers on the same files, registers out of the patch mean
    pixels = AutoImageProcessor.from_pretrained(ckpt)(images=[im.convert("RGB") for im in images],
                                                      return_tensors="np")["pixel_values"]
    hidden, _ = hf_vision_reference("dinov2", ckpt, pixels.astype(np.float32))
    np.testing.assert_allclose(a["mean", "2"], hidden[2][:, 3:].mean(axis=1), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(a["cls", "1"], hidden[1][:, 0], atol=2e-5, rtol=1e-4)


def test_image_corpus_errors_are_one_line(setup, tmp_path):
    """Catches: a missing file found only after the model ran, a non-image column read as images, a text
    model given images."""
    import datasets

    from layerscope.data.images import read_images
    from layerscope.extraction.image_extract import extract_images

    root, _, export, folder, _, _ = setup
    listing = tmp_path / "list.txt"
    listing.write_text(f"{folder / 'digit_0.png'}\n\nnope.png\n")
    with pytest.raises(InputError, match=r"line 3: nope.png is not a file"):
        read_images(listing)
    ds = datasets.Dataset.from_dict({"image": ["a", "b"]})
    with pytest.raises(InputError, match="not images"):
        read_images(ds)
    with pytest.raises(InputError, match="no column 'picture'"):
        read_images(ds, column="picture")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no image files"):
        read_images(tmp_path / "empty")
    with pytest.raises(InputError, match="'eos' is not one of"):
        extract_images(export, folder, tmp_path / "s", poolings=["cls", "eos"])
    assert not (tmp_path / "s").exists()


def test_extract_images_command_is_one_line_on_bad_input(setup, tmp_path, capsys):
    """Catches: a traceback (or a made store) for a source that is not there, or a text model given images."""
    from cli_helpers import run_cli

    _, _, export, folder, _, _ = setup
    code, text = run_cli(["extract-images", export, tmp_path / "nowhere", "--out", tmp_path / "s"], capsys)
    assert code == 2 and "no such folder or file" in text and "Traceback" not in text
    assert len([line for line in text.splitlines() if line.strip()]) == 1
    code, text = run_cli(["extract-images", "minilm", folder, "--out", tmp_path / "t"], capsys)
    assert code == 2 and "is not a vision export" in text, text
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists()
