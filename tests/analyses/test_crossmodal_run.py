"""``run crossmodal`` over both towers of one tiny CLIP and scikit-learn's digits: the saved mutual k-NN of
every layer pair equals the platonic-representation definition applied to plain transformers' vectors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from knn_reference import mutual_knn, relative_retrieval  # noqa: E402
from tiny_models import build_tiny_model  # noqa: E402

from layerscope.errors import InputError  # noqa: E402

N, K = 16, 3


@pytest.fixture(scope="module")
def clip_pairs(tmp_path_factory):
    import transformers as t
    from PIL import Image
    from sklearn.datasets import load_digits

    from layerscope.export.exporter import export_model

    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("crossmodal")
    ckpt = build_tiny_model("clip-text", root / "clip")
    t.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(ckpt)
    export_model(resolve_source(str(ckpt)), root / "clipv", tower="vision")
    digits = load_digits()
    (root / "img").mkdir()
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    with open(root / "pairs.jsonl", "w") as fh:
        for i in range(N):
            Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8), "L").resize((32, 32)).save(root / f"img/{i}.png")
            caption = f"a photo of the digit {words[digits.target[i]]} number {i}"
            fh.write(json.dumps({"image": f"img/{i}.png", "caption": caption}) + "\n")
    return root, ckpt


def test_crossmodal_mutual_knn_equals_the_definition(clip_pairs):
    """Catches: image and caption rows paired out of order, a layer pair's figure filed under another pair,
    the image tower's CLS or the text tower's EOS vector taken from the wrong position."""
    import torch
    import transformers as t
    from PIL import Image

    from layerscope.analyses.base import RunRequest, run_analysis

    root, ckpt = clip_pairs
    ctx = RunRequest(models=[str(root / "clipv"), str(ckpt)], engine="ort", data=str(root / "pairs.jsonl"),
                     out=root / "run", options={"k": K, "permutations": 5, "bootstrap": 5})
    _, res = run_analysis("crossmodal", ctx)
    combined = res["combined"]
    assert combined["image_layers"] == ["0", "1", "2"] and combined["text_layers"] == ["0", "1", "2"]
    rows = [json.loads(line) for line in (root / "pairs.jsonl").read_text().splitlines()]
    model = t.CLIPModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    proc = t.CLIPImageProcessor.from_pretrained(ckpt)
    tok = t.AutoTokenizer.from_pretrained(ckpt)
    pixels = proc(images=[Image.open(root / r["image"]).convert("RGB") for r in rows], return_tensors="pt")
    enc = tok([r["caption"] for r in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        vis = model.vision_model(pixel_values=pixels["pixel_values"], output_hidden_states=True).hidden_states
        txt = model.text_model(**enc, output_hidden_states=True).hidden_states
    eos = (enc["input_ids"] == tok.eos_token_id).int().argmax(dim=1)
    checked = 0
    for i, img in enumerate(vis):
        for j, states in enumerate(txt):
            got = combined["figures"]["mutual_knn"]["value"][i][j]
            image_rows = img[:, 0].numpy()
            text_rows = states[torch.arange(N), eos].numpy()
            if len(np.unique(image_rows, axis=0)) <= K or len(np.unique(text_rows, axis=0)) <= K:
                assert got is None  # undefined: saved as null
                continue
            assert got == pytest.approx(mutual_knn(image_rows, text_rows, K), abs=1e-12), (i, j)
            checked += 1
    assert checked >= 4
    assert (root / "run" / "crossmodal_heatmap.png").exists()
    page = (root / "run" / "report.html").read_text(encoding="utf-8")
    assert "mutual k-NN: clipv vs clip" in page and "Best pair: image layer" in page
    # the pairs shown small: each thumbnail is its image (32x32 grey, kept at its size), inline, its caption escaped
    import base64
    import io
    import re

    shown = re.findall(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(shown) == N
    first = np.asarray(Image.open(io.BytesIO(base64.b64decode(shown[0]))))
    np.testing.assert_array_equal(first, np.asarray(Image.open(root / rows[0]["image"]).convert("RGB")))
    assert f"<figcaption>{rows[3]['caption']}</figcaption>" in page
    for model in res["per_model"].values():  # the pair's headline, shown for each model
        assert model["summary"]["best_value"] == combined["best"]["value"]


def _clip_states(ckpt, images, captions):
    """Plain transformers' CLIP: every layer's CLS vector of the images and EOS vector of the captions."""
    import torch
    import transformers as t

    model = t.CLIPModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    pixels = t.CLIPImageProcessor.from_pretrained(ckpt)(images=images, return_tensors="pt")["pixel_values"]
    tok = t.AutoTokenizer.from_pretrained(ckpt)
    enc = tok(captions, padding=True, return_tensors="pt")
    with torch.no_grad():
        vis = model.vision_model(pixel_values=pixels, output_hidden_states=True).hidden_states
        txt = model.text_model(**enc, output_hidden_states=True).hidden_states
    eos = (enc["input_ids"] == tok.eos_token_id).int().argmax(dim=1)
    return [v[:, 0].numpy() for v in vis], [s[torch.arange(len(captions)), eos].numpy() for s in txt]


def test_the_built_in_digits_pair_each_image_with_its_own_label(clip_pairs, tmp_path):
    """Without --data: scikit-learn's first ten digits, each image (8x8, 16 grey levels, enlarged 8 times)
    with "a photo of the digit <its label>"; every layer pair's mutual k-NN and retrieval both ways equal those
    of plain transformers' vectors of exactly those pairs. Catches: an image paired with another digit's
    caption (the previous one's, say), digits enlarged or scaled otherwise, retrieval's directions swapped or a
    rank counted on the wrong axis in the run."""
    from PIL import Image
    from sklearn.datasets import load_digits

    from layerscope.analyses.base import RunRequest, run_analysis

    root, ckpt = clip_pairs
    n, k = 10, 3
    _, res = run_analysis("crossmodal", RunRequest(models=[str(root / "clipv"), str(ckpt)], engine="ort",
                                                  out=tmp_path / "run", options={"n": n, "k": k, "permutations": 0,
                                                                                  "bootstrap": 0}))
    combined = res["combined"]
    digits = load_digits()
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    captions = [f"a photo of the digit {words[digits.target[i]]}" for i in range(n)]
    assert [p["caption"] for p in combined["pairs"]] == captions
    big = [np.repeat(np.repeat(digits.images[i] * 255 / 16, 8, axis=0), 8, axis=1).astype(np.uint8) for i in range(n)]
    images = [Image.fromarray(pixels, "L").convert("RGB") for pixels in big]
    vis, txt = _clip_states(ckpt, images, captions)
    figures, checked = combined["figures"], 0
    for i, image_rows in enumerate(vis):
        for j, text_rows in enumerate(txt):
            if len(np.unique(image_rows, axis=0)) <= k or len(np.unique(text_rows, axis=0)) <= k:
                continue
            assert figures["mutual_knn"]["value"][i][j] == pytest.approx(mutual_knn(image_rows, text_rows, k),
                                                                         abs=1e-12), (i, j)
            a_to_b, b_to_a = relative_retrieval(image_rows, text_rows, acc_k=1, seed=0)
            assert figures["a_to_b"]["value"][i][j] == pytest.approx(a_to_b, abs=1e-12), (i, j)
            assert figures["b_to_a"]["value"][i][j] == pytest.approx(b_to_a, abs=1e-12), (i, j)
            checked += 1
    assert checked >= 4


def test_crossmodal_needs_one_image_and_one_text_model(clip_pairs, tmp_path):
    """Catches: two text models compared as if one side were images, more built-in digits asked than exist."""
    from layerscope.analyses.base import RunRequest, run_analysis

    root, ckpt = clip_pairs
    with pytest.raises(InputError, match="one vision export and one text model"):
        run_analysis("crossmodal", RunRequest(models=[str(ckpt), str(ckpt)], engine="ort",
                                              data=str(root / "pairs.jsonl"), out=tmp_path / "x",
                                              options={"k": K, "permutations": 0, "bootstrap": 0}))
    with pytest.raises(InputError, match="--n must be between 4 and 1797"):
        run_analysis("crossmodal", RunRequest(models=[str(root / "clipv"), str(ckpt)], engine="ort",
                                              out=tmp_path / "y", options={"n": 2000}))


def test_captions_shared_by_many_images_are_one_line_before_any_model_runs(clip_pairs, tmp_path):
    """Catches: the built-in digits (one caption per class, 10 distinct) run with --k 10, where every text row
    has more equal neighbours than k and mutual k-NN is undefined on every pair: an 'internal error' after
    every image and caption went through the models."""
    from layerscope.analyses.base import RunRequest, run_analysis

    root, ckpt = clip_pairs
    with pytest.raises(InputError, match=r"the built-in digits \(one caption per class\): 40 pairs hold 10 "
                                         r"distinct captions; mutual k-NN needs more than --k 10"):
        run_analysis("crossmodal", RunRequest(models=[str(root / "clipv"), str(ckpt)], engine="ort",
                                              out=tmp_path / "z", options={"n": 40, "k": 10}))
    assert not (tmp_path / "z").exists()
