"""``run vision_lens``: zero-shot accuracy by layer of a tiny CLIP's image tower equals plain transformers'."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import build_tiny_model  # noqa: E402

from layerscope.errors import InputError  # noqa: E402

N = 24


def test_zero_shot_by_layer_equals_transformers(tmp_path):
    """Catches: the final norm or the projection left out or applied twice, a layer's CLS taken from another
    layer, labels and prompts matched in another order."""
    import torch
    import transformers as t
    from PIL import Image

    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.analyses.crossmodal import digit_pairs
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    ckpt = build_tiny_model("clip-text", tmp_path / "clip")
    t.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(ckpt)
    export_model(resolve_source(str(ckpt)), tmp_path / "clipv", tower="vision")
    _, res = run_analysis("vision_lens", RunRequest(models=[str(tmp_path / "clipv")], engine="ort",
                                                    out=tmp_path / "run", options={"n": N}))
    (fig,) = res["per_model"].values()
    got = {r["layer"]: r["accuracy"] for r in fig["tables"]["layers"]}
    assert sorted(got) == ["0", "1", "2"]

    pairs = digit_pairs(N)
    labels = [caption.rsplit(" ", 1)[-1] for _, _, caption in pairs]
    classes = sorted(set(labels))
    model = t.CLIPModel.from_pretrained(ckpt).eval()
    proc = t.CLIPImageProcessor.from_pretrained(ckpt)
    tok = t.AutoTokenizer.from_pretrained(ckpt)
    pixels = proc(images=[Image.open(io.BytesIO(png)).convert("RGB") for _, png, _ in pairs], return_tensors="pt")
    prompts = tok([f"a photo of the digit {c}" for c in classes], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.vision_model(**pixels, output_hidden_states=True).hidden_states
        text = torch.nn.functional.normalize(model.get_text_features(**prompts), dim=-1)
        last = model(input_ids=prompts["input_ids"], attention_mask=prompts["attention_mask"], **pixels)
        truth = torch.tensor([classes.index(lab) for lab in labels])
        for layer, states in enumerate(hidden):
            joint = model.visual_projection(model.vision_model.post_layernorm(states[:, 0]))
            pred = (torch.nn.functional.normalize(joint, dim=-1) @ text.T).argmax(-1)
            assert fig["predictions"][str(layer)] == [classes[int(c)] for c in pred], layer
            assert got[str(layer)] == pytest.approx(int((pred == truth).sum()) / N, abs=1e-12)
    # the last layer is CLIP's own zero-shot classification
    standard = [classes[int(c)] for c in last.logits_per_image.argmax(-1)]
    assert fig["predictions"]["2"] == standard
    assert len(set(standard)) > 1  # the predictions tell the images apart: a reordering would show
    # report.html: every shown image small, inline, captioned with its label and the best and last layers' picks
    assert [im["label"] for im in fig["images"]] == labels[:len(fig["images"])] and len(fig["images"]) == N
    page = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    assert page.count("<img src='data:image/png;base64,") == N and "zero-shot accuracy by layer" in page
    best = fig["summary"]["best_layer"]
    first = f"label: {labels[0]}<br>layer {best}: {fig['predictions'][best][0]}<br>layer 2: {fig['predictions']['2'][0]}"
    assert first in page
    # its band is a Wilson interval (a proportion), and the chart names it so, not as a bootstrap interval
    assert "95% Wilson interval" in page and "bootstrap" not in page.lower()


def test_vision_lens_refuses_a_template_without_a_slot(tmp_path):
    """Catches: every class given the same prompt (no {} for the label)."""
    from layerscope.analyses.base import RunRequest, run_analysis

    with pytest.raises(InputError, match="--template needs"):
        run_analysis("vision_lens", RunRequest(models=["minilm"], engine="ort", out=tmp_path / "x",
                                               options={"template": "a photo"}))


def _word_tokenizer(ckpt: Path, words: list[str]) -> None:
    """A word-level tokenizer over ``words`` saved into ``ckpt`` (the tiny SigLIP's text tower reads 99 ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<pad>", "</s>", *dict.fromkeys(words)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                            eos_token="</s>").save_pretrained(ckpt)


def test_siglip_zero_shot_by_layer_equals_transformers(tmp_path):
    """Catches: SigLIP's layers read through a CLS it does not have, its final norm or attention-pooling head
    left out, prompts padded unlike SigLIP's training (its text tower pools the last position)."""
    import torch
    import transformers as t
    from PIL import Image

    from tiny_vision import build_tiny_vision

    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.analyses.crossmodal import WORDS, digit_pairs
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    ckpt = build_tiny_vision("siglip", tmp_path / "siglip")
    _word_tokenizer(ckpt, "a photo of the digit".split() + list(WORDS))
    export_model(resolve_source(str(ckpt)), tmp_path / "sigv", tower="vision")
    _, res = run_analysis("vision_lens", RunRequest(models=[str(tmp_path / "sigv")], engine="ort",
                                                    out=tmp_path / "run", options={"n": N}))
    (fig,) = res["per_model"].values()
    pairs = digit_pairs(N)
    labels = [caption.rsplit(" ", 1)[-1] for _, _, caption in pairs]
    classes = sorted(set(labels))
    model = t.SiglipModel.from_pretrained(ckpt, attn_implementation="eager").eval()
    pixels = t.SiglipImageProcessor.from_pretrained(ckpt)(
        images=[Image.open(io.BytesIO(png)).convert("RGB") for _, png, _ in pairs], return_tensors="pt")
    tok = t.AutoTokenizer.from_pretrained(ckpt)
    ids = tok([f"a photo of the digit {c}" for c in classes], padding="max_length", max_length=16,
              return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = t.SiglipVisionModel.from_pretrained(ckpt, attn_implementation="eager")(
            **pixels, output_hidden_states=True).hidden_states
        text = torch.nn.functional.normalize(model.get_text_features(input_ids=ids), dim=-1)
        tower = model.vision_model
        truth = torch.tensor([classes.index(lab) for lab in labels])
        for layer, states in enumerate(hidden):
            joint = tower.head(tower.post_layernorm(states))
            pred = (torch.nn.functional.normalize(joint, dim=-1) @ text.T).argmax(-1)
            assert fig["predictions"][str(layer)] == [classes[int(c)] for c in pred], layer
            row = next(r for r in fig["tables"]["layers"] if r["layer"] == str(layer))
            assert row["accuracy"] == pytest.approx(int((pred == truth).sum()) / N, abs=1e-12)
        standard = model(input_ids=ids, **pixels).logits_per_image.argmax(-1)
    assert fig["predictions"]["2"] == [classes[int(c)] for c in standard]  # SigLIP's own zero-shot
    assert any(len(set(p)) > 1 for p in fig["predictions"].values())  # images told apart: a reordering would show
