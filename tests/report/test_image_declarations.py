"""The image analyses (vision_lens, cls_attention, crossmodal) drawn from their declared figures: report.md and
report.html from typed results, the shown images read as typed records, and one line for a results.json whose
figures or records are garbled."""

from __future__ import annotations

import copy

import pytest

from layerscope.errors import InputError

LENS = {"summary": {"best_accuracy": 0.5, "best_layer": "1", "last_layer": "2", "n_images": 8,
                    "classes": ["one", "two"], "chance": 0.5},
        "tables": {"layers": [{"layer": "1", "accuracy": 0.5, "accuracy_ci_low": 0.2, "accuracy_ci_high": 0.8},
                              {"layer": "2", "accuracy": 0.25, "accuracy_ci_low": 0.07, "accuracy_ci_high": 0.59}]},
        "images": [{"id": 0, "label": "<i>one</i>", "thumbnail": "x", "predicted": {"1": "one", "2": "two"}}]}
CLS = {"summary": {"last_share_on_patches": 0.7, "layers": 2, "grid": [4, 4], "n_images": 6, "engine": "ort",
                   "attention_precision": "fp32"},
       "tables": {"layers": [{"layer": "1", "share_on_patches": 0.6, "entropy_over_patches": 2.5},
                             {"layer": "2", "share_on_patches": 0.7, "share_on_patches_ci_low": 0.65,
                              "share_on_patches_ci_high": 0.75, "entropy_over_patches": 2.4}]},
       "maps": [{"id": 3, "label": "three", "layer": "2", "map": [[0.1, 0.2], [0.3, 0.4]], "thumbnail": "x"}]}


def _combined() -> dict:
    grid = [[0.1, None, 0.3], [0.4, 0.5, 0.6]]
    fig = {"value": grid, "null_mean": grid, "p": grid, "ci_low": grid, "ci_high": grid}
    return {"image_model": "clipv", "text_model": "clip", "image_layers": ["0", "1"], "text_layers": ["0", "1", "2"],
            "n": 16, "k": 3, "acc_k": 1, "permutations": 5, "bootstrap": 5,
            "pairs": [{"id": "a", "image": "a.png", "caption": "<b>a</b> cat"}],
            "figures": {"mutual_knn": fig, "cka": copy.deepcopy(fig)},
            "best": {"figure": "mutual_knn", "image_layer": "1", "text_layer": "2", "value": 0.6, "ci_low": 0.5,
                     "ci_high": 0.7, "chosen_share": 0.8, "p": 0.01, "interval": "percentile bootstrap"}}


def _doc(analysis: str, **parts) -> dict:
    return {"analysis": analysis, "per_model": {}, "combined": {}, **parts}


def _read(doc: dict):
    """A results document read as ``layerscope report`` reads results.json: its declared figures checked."""
    from layerscope.analyses.rendering import declared_figures
    from layerscope.report.results import Results

    return Results.from_document(doc, "run/results.json", figures_of=declared_figures)


def test_vision_lens_report_md_and_page_are_its_declaration():
    """Catches: report.md's rows from another column than the accuracy and its own interval, an image captioned
    with another layer's pick than the best and the last layer's, a label put into the page as markup."""
    from layerscope.analyses.vision_lens import VisionLens
    from layerscope.report.html_page import build_page

    results = _read(_doc("vision_lens", per_model={"clipv": copy.deepcopy(LENS)}))
    text = VisionLens().report(results)
    assert "8 images, chance 0.50; best layer 1 (0.500), last layer 2." in text
    assert "| 2 | 0.250 | 0.070 | 0.590 |" in text and "| 1 | 0.500 | 0.200 | 0.800 |" in text
    page = build_page(results, VisionLens.metadata.figures)
    assert "label: &lt;i&gt;one&lt;/i&gt;<br>layer 1: one<br>layer 2: two" in page and "<i>one" not in page
    assert "Vision lens: zero-shot accuracy by layer" in page and "95% Wilson interval" in page


def test_cls_attention_report_md_and_page_are_its_declaration():
    """Catches: a layer without an interval (no bootstrap) failing the report, the entropy from another row, a
    map captioned with another layer than the one drawn."""
    from layerscope.analyses.cls_attention import ClsAttention
    from layerscope.report.html_page import build_page

    results = _read(_doc("cls_attention", per_model={"dino": copy.deepcopy(CLS)}))
    text = ClsAttention().report(results)
    assert "6 images on a 4x4 patch grid; CLS attention on the patches at the last layer 0.700" in text
    assert "| 1 | 0.600 | undefined | undefined | 2.500 |" in text and "| 2 | 0.700 | 0.650 | 0.750 | 2.400 |" in text
    page = build_page(results, ClsAttention.metadata.figures)
    assert "label: three<br>layer 2" in page and "CLS attention on the patches, by layer" in page


def test_crossmodal_report_md_and_page_are_its_declaration():
    """Catches: the best pair named from another cell, a heat map per figure missing from report.html, a caption
    from the data put into the page as markup."""
    from layerscope.analyses.crossmodal import CrossModalAnalysis
    from layerscope.report.html_page import build_page

    results = _read(_doc("crossmodal", combined=_combined()))
    text = CrossModalAnalysis().report(results)
    assert "Best pair: image layer 1, text layer 2: 0.6000 by mutual_knn" in text
    assert "0.5000 to 0.7000; best again in 80% of resamples; shuffled-pairing p = 0.01" in text
    page = build_page(results, CrossModalAnalysis.metadata.figures)
    assert "mutual k-NN: clipv vs clip" in page and "linear CKA: clipv vs clip" in page
    assert "image -&gt; caption acc@k" not in page  # a figure the run did not keep has no heat map
    assert "&lt;b&gt;a&lt;/b&gt; cat" not in page  # a pair without a thumbnail is not shown


def test_crossmodal_console_shows_the_best_pair_with_model_names_as_text():
    """Catches: the console summary of a run that keeps its headline in the combined figures printing nothing (its
    declaration has no per-model sentence), a model name read as Rich markup."""
    from rich.console import Console

    from layerscope.analyses.crossmodal import CrossModalAnalysis

    console = Console(record=True, width=300)
    CrossModalAnalysis().console_summary(_read(_doc("crossmodal", combined={**_combined(), "image_model": "[bold]v"})),
                                         console)
    text = console.export_text()
    assert "16 image-caption pairs: [bold]v (images) and clip (captions)" in text
    assert "Best pair: image layer 1, text layer 2: 0.6000 by mutual_knn" in text


@pytest.mark.parametrize("doc,message", [
    (lambda: _doc("vision_lens", per_model={"m": {**LENS, "tables": {"layers": [{"layer": "1", "accuracy": "0.5"}]}}}),
     "per_model.m.tables.layers\\[0\\].accuracy is str, not int or float"),
    (lambda: _doc("vision_lens", per_model={"m": {**LENS, "images": [{**LENS["images"][0], "predicted": {"1": 3}}]}}),
     "per_model.m.images\\[0\\].predicted.1 is int, not str"),
    (lambda: _doc("vision_lens", per_model={"m": {**LENS, "images": "x"}}), "per_model.m.images is str, not list"),
    (lambda: _doc("cls_attention", per_model={"m": {**CLS, "maps": [{**CLS["maps"][0], "map": [[0.1], [0.2, 0.3]]}]}}),
     "per_model.m.maps\\[0\\].map is not a grid"),
    (lambda: _doc("cls_attention", per_model={"m": {**CLS, "maps": [{**CLS["maps"][0], "layer": None}]}}),
     "per_model.m.maps\\[0\\].layer is NoneType"),
    (lambda: _doc("crossmodal", combined={**_combined(), "pairs": [{"id": "a", "caption": 5}]}),
     "combined.pairs\\[0\\].caption is int, not str"),
    (lambda: _doc("crossmodal", combined={**_combined(), "figures": {"cka": {"value": [[0.1, "x", 0.3], [0, 0, 0]]}}}),
     "combined.figures.cka.value\\[0\\]\\[1\\] is str"),
])
def test_garbled_figures_or_records_are_one_line(doc, message):
    """Catches: an edited results.json drawn anyway (a string where a number belongs, a map that is no grid) or
    failing report.md or report.html with a bare KeyError or TypeError."""
    with pytest.raises(InputError, match=message) as err:
        _read(doc())
    assert str(err.value).startswith("run/results.json: ") and "\n" not in str(err.value)


def test_a_summary_without_the_layers_shown_is_one_line():
    """Catches: the vision lens's page drawn with a best layer the summary does not hold (a KeyError)."""
    from layerscope.report.image_html import vision_lens_section

    fig = copy.deepcopy(LENS)
    fig["summary"].pop("best_layer")
    with pytest.raises(InputError, match="per_model.m.summary.best_layer is NoneType") as err:
        vision_lens_section(_read(_doc("vision_lens", per_model={"m": fig})))
    assert "\n" not in str(err.value)


def test_a_labels_file_line_that_is_not_json_is_one_line(tmp_path):
    """Catches: a --data line that is not JSON (or not an object) failing with a JSONDecodeError traceback."""
    from PIL import Image

    from layerscope.analyses.vision_lens import labelled_images

    Image.new("RGB", (2, 2)).save(tmp_path / "a.png")  # an intact image: only the line itself is wrong
    for bad, message in (('{"image": "a.png", "label": "x"}\nnot json\n', "line 2 is not JSON"),
                         ('["a.png", "x"]\n', "line 1 needs an existing")):
        (tmp_path / "data.jsonl").write_text(bad, encoding="utf-8")
        with pytest.raises(InputError, match=message):
            labelled_images(str(tmp_path / "data.jsonl"), 4)
