"""The image analyses decide from config.json (or an export's manifest) before any export: a model they cannot
read is one line with nothing exported; one they can read runs straight from its checkpoint, a two-tower one with
``--tower vision``, and a checkpoint's cached export gets its attention graph on first use."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import build_tiny_model  # noqa: E402
from tiny_vision import build_tiny_vision  # noqa: E402

from layerscope.analyses.base import RunRequest, run_analysis  # noqa: E402
from layerscope.errors import InputError  # noqa: E402

N = 8


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """A tiny two-tower CLIP with its tokenizer and image processor."""
    import transformers as t

    ckpt = build_tiny_model("clip-text", tmp_path_factory.mktemp("clip") / "clip")
    t.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(ckpt)
    return ckpt


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def no_export(monkeypatch):
    from layerscope.export import exporter

    def refused(*args, **kwargs):
        raise AssertionError("an export was started")

    monkeypatch.setattr(exporter, "export_model", refused)


def _run(name: str, model, out: Path, **kw):
    return run_analysis(name, RunRequest(models=[str(model)], engine="ort", out=out, options={"n": N}, **kw))


@pytest.mark.parametrize("name", ["vision_lens", "cls_attention"])
def test_a_two_tower_checkpoint_without_tower_is_one_line_before_any_export(name, clip, tmp_path, home, no_export):
    """Catches: minutes of exporting CLIP's text tower before saying the analysis needs --tower vision."""
    with pytest.raises(InputError, match="two-tower clip checkpoint .*add --tower vision"):
        _run(name, clip, tmp_path / "r")
    assert not (tmp_path / "r").exists() and not (home / "exports").exists()


def test_models_the_image_analyses_cannot_read_are_refused_before_any_export(clip, tmp_path, home, no_export):
    vit = build_tiny_vision("vit", tmp_path / "vit")
    with pytest.raises(InputError, match="is a vit tower; the vision lens reads the image tower of a CLIP or SigLIP"):
        _run("vision_lens", vit, tmp_path / "a")
    alone = build_tiny_vision("clip-vision", tmp_path / "clip-vision")
    with pytest.raises(InputError, match="image tower alone .*give the two-tower checkpoint with --tower vision"):
        _run("vision_lens", alone, tmp_path / "b")
    sig = build_tiny_vision("siglip-vision", tmp_path / "sig")
    with pytest.raises(InputError, match="without a CLS token"):
        _run("cls_attention", sig, tmp_path / "c")
    with pytest.raises(InputError, match="reads text; cls_attention reads a vision tower"):
        _run("cls_attention", "minilm", tmp_path / "d")
    with pytest.raises(InputError, match="sts reads text: leave out --tower"):
        run_analysis("sts", RunRequest(models=["minilm"], engine="ort", out=tmp_path / "e", tower="vision"))
    assert not (home / "exports").exists()


def test_cls_attention_runs_straight_from_a_checkpoint(tmp_path, home):
    """Catches: a checkpoint's cached export refused for lacking the attention graph USAGE says it gets on first
    use."""
    vit = build_tiny_vision("vit", tmp_path / "vit")
    _, res = _run("cls_attention", vit, tmp_path / "run")
    (fig,) = res["per_model"].values()
    shares = [r["share_on_patches"] for r in fig["tables"]["layers"]]
    assert len(shares) == 2 and all(0.0 < s < 1.0 for s in shares)
    (entry,) = [p for p in (home / "exports").iterdir() if p.is_dir()]
    assert (entry / "model.attn.onnx").is_file()


def test_vision_lens_runs_straight_from_a_two_tower_checkpoint(clip, tmp_path, home):
    """With --tower vision: the image tower exported into the cache, its last layer's predictions CLIP's own
    zero-shot classification (transformers' logits_per_image)."""
    import io

    import torch
    import transformers as t
    from PIL import Image

    from layerscope.analyses.crossmodal import digit_pairs

    _, res = _run("vision_lens", clip, tmp_path / "run", tower="vision")
    (fig,) = res["per_model"].values()
    pairs = digit_pairs(N)
    classes = sorted({caption.rsplit(" ", 1)[-1] for _, _, caption in pairs})
    model = t.CLIPModel.from_pretrained(clip).eval()
    pixels = t.CLIPImageProcessor.from_pretrained(clip)(
        images=[Image.open(io.BytesIO(png)).convert("RGB") for _, png, _ in pairs], return_tensors="pt")
    prompts = t.AutoTokenizer.from_pretrained(clip)([f"a photo of the digit {c}" for c in classes], padding=True,
                                                    return_tensors="pt")
    with torch.no_grad():
        logits = model(**prompts, **pixels).logits_per_image
    assert fig["predictions"]["2"] == [classes[int(c)] for c in np.asarray(logits.argmax(-1))]
    (entry,) = [p for p in (home / "exports").iterdir() if p.is_dir()]
    assert "clip-vision" in (entry / "manifest.json").read_text()
