"""The vision lens's and cls_attention's per-model figures read back from results.json as typed fields (what
report.md and report.html draw), and one line for a file whose figures are garbled."""

from __future__ import annotations

import copy
import math

import pytest

from layerscope.errors import InputError

LENS = {"summary": {"best_accuracy": 0.5, "best_layer": "1", "last_layer": "2", "n_images": 8,
                    "classes": ["one", "two"], "chance": 0.5},
        "tables": {"layers": [{"layer": "1", "accuracy": 0.5, "accuracy_ci_low": 0.2, "accuracy_ci_high": 0.8},
                              {"layer": "2", "accuracy": 0.25, "accuracy_ci_low": 0.07, "accuracy_ci_high": 0.59}]},
        "images": [{"id": 0, "label": "one", "thumbnail": "x", "predicted": {"1": "one", "2": "two"}}]}
CLS = {"summary": {"last_share_on_patches": 0.7, "layers": 2, "grid": [4, 4], "n_images": 6},
       "tables": {"layers": [{"layer": "1", "share_on_patches": 0.6, "entropy_over_patches": 2.5},
                             {"layer": "2", "share_on_patches": 0.7, "share_on_patches_ci_low": 0.65,
                              "share_on_patches_ci_high": 0.75, "entropy_over_patches": 2.4}]},
       "maps": []}


def test_vision_lens_report_reads_its_typed_figures():
    """Catches: report.md rows from another column than the accuracy and its own interval."""
    from layerscope.analyses.vision_lens import VisionLens
    from layerscope.report.vision_results import VisionLensFigures

    fig = VisionLensFigures.read(LENS, "r")
    assert (fig.best_layer, fig.last_layer, fig.classes, fig.n_images) == ("1", "2", ("one", "two"), 8)
    text = VisionLens().report({"per_model": {"clipv": LENS}})
    assert "## vision lens: clipv, 8 images, 2 classes (chance 0.50)" in text
    assert "| 2 | 0.250 | 0.070 to 0.590 |" in text


def test_cls_attention_report_reads_its_typed_figures():
    """Catches: a layer without an interval (no bootstrap) failing the report, entropy from another row."""
    from layerscope.analyses.cls_attention import ClsAttention
    from layerscope.report.vision_results import ClsAttentionFigures

    fig = ClsAttentionFigures.read(CLS, "r")
    assert fig.grid == (4, 4) and fig.entropy == (2.5, 2.4) and math.isnan(fig.layers[0].ci_low)
    text = ClsAttention().report({"per_model": {"dino": CLS}})
    assert "## CLS attention: dino, 6 images, 4x4 patches" in text
    assert "| 1 | 0.600 | nan to nan | 2.500 |" in text and "| 2 | 0.700 | 0.650 to 0.750 | 2.400 |" in text


@pytest.mark.parametrize("which,edit,message", [
    ("lens", lambda f: f["summary"].pop("best_layer"), "KeyError: 'best_layer'"),
    ("lens", lambda f: f["tables"]["layers"][0].update(accuracy="0.5"), "accuracy is str, not a number"),
    ("lens", lambda f: f["summary"].update(classes=["one"]), "classes is not a list of at least two labels"),
    ("cls", lambda f: f["summary"].update(grid=[4]), "grid is not \\[rows, columns\\]"),
    ("cls", lambda f: f["tables"].update(layers=[]), "table layers is not a list of rows"),
    ("cls", lambda f: f.update(summary=[1]), "summary is list, not an object"),
])
def test_garbled_figures_are_one_line(which, edit, message):
    """Catches: an edited results.json failing report.md or report.html with a bare KeyError, or drawn from a
    string where a number belongs."""
    from layerscope.analyses.cls_attention import ClsAttention
    from layerscope.analyses.vision_lens import VisionLens

    fig = copy.deepcopy(LENS if which == "lens" else CLS)
    edit(fig)
    analysis = VisionLens() if which == "lens" else ClsAttention()
    with pytest.raises(InputError, match=message) as err:
        analysis.report({"per_model": {"m": fig}})
    assert str(err.value).startswith("results.json per_model.m: the ") and "\n" not in str(err.value)


def test_a_labels_file_line_that_is_not_json_is_one_line(tmp_path):
    """Catches: a --data line that is not JSON (or not an object) failing with a JSONDecodeError traceback."""
    from layerscope.analyses.vision_lens import labelled_images

    (tmp_path / "a.png").write_bytes(b"")
    for bad, message in (('{"image": "a.png", "label": "x"}\nnot json\n', "line 2 is not JSON"),
                         ('["a.png", "x"]\n', "line 1 needs an existing")):
        (tmp_path / "data.jsonl").write_text(bad, encoding="utf-8")
        with pytest.raises(InputError, match=message):
            labelled_images(str(tmp_path / "data.jsonl"), 4)
