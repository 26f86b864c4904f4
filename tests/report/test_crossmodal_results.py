"""crossmodal's combined figures read back from results.json as typed fields: what its report.md, heat maps and
report.html draw, and one line (never a KeyError or a wrong picture) for a file whose figures are garbled."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.report.crossmodal_results import CrossmodalResult


def _combined() -> dict:
    """A crossmodal run's combined block as results.json holds it: 2 image layers x 3 text layers."""
    grid = [[0.1, None, 0.3], [0.4, 0.5, 0.6]]
    fig = {"value": grid, "null_mean": grid, "p": grid, "ci_low": grid, "ci_high": grid}
    return {"image_model": "clipv", "text_model": "clip", "image_layers": ["0", "1"], "text_layers": ["0", "1", "2"],
            "n": 16, "k": 3, "acc_k": 1, "permutations": 5, "bootstrap": 5, "pairs": [],
            "figures": {"mutual_knn": fig, "cka": copy.deepcopy(fig)},
            "best": {"figure": "mutual_knn", "image_layer": "1", "text_layer": "2", "value": 0.6, "ci_low": 0.5,
                     "ci_high": 0.7, "chosen_share": 0.8, "p": 0.01, "interval": "percentile bootstrap"}}


def test_the_combined_figures_read_as_fields():
    """Catches: a grid read transposed, a null cell read as 0 (a figure where none is defined), the best pair
    marked on another cell than its layers'."""
    c = CrossmodalResult.read(_combined())
    assert c.image_layers == ("0", "1") and c.text_layers == ("0", "1", "2") and c.n == 16
    grid = c.figures["mutual_knn"].value
    assert grid.shape == (2, 3) and grid[1, 0] == 0.4 and math.isnan(grid[0, 1])
    assert c.best.figure == "mutual_knn" and c.best.p == 0.01 and c.best_cell == (1, 2)
    assert CrossmodalResult.read({"image_model": "a"}) is None  # a run that wrote no figures: nothing to draw


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["figures"]["cka"].update(value=[[0.1, 0.2, 0.3]]), "cka.value is 1x3, not image layers x text "
                                                                    "layers \\(2x3\\)"),
    (lambda c: c["best"].update(text_layer="7"), "the best pair .* is not among the figures and layers"),
    (lambda c: c["figures"]["mutual_knn"].pop("p"), "KeyError"),
    (lambda c: c["figures"]["mutual_knn"]["value"][0].__setitem__(0, "0.1"), "value is str, not a number"),
    (lambda c: c.update(n=True), "n is True, not a count"),
    (lambda c: c.update(image_layers="01"), "the layers are not a list"),
])
def test_garbled_figures_are_one_line(edit, message):
    """Catches: an edited results.json drawn anyway (a heat map of the wrong shape, a best pair marked off the
    grid) or failing with a bare KeyError/IndexError when report.md or report.html is rewritten."""
    doc = _combined()
    edit(doc)
    with pytest.raises(InputError, match=message) as err:
        CrossmodalResult.read(doc, "run/results.json")
    assert str(err.value).startswith("run/results.json: crossmodal's combined figures are garbled")
    assert "\n" not in str(err.value)


def test_report_and_heat_map_draw_the_typed_figures(tmp_path):
    """Catches: report.md naming another pair than the best one, the heat map file not written."""
    from layerscope.analyses.crossmodal import CrossModalAnalysis

    analysis = CrossModalAnalysis()
    text = analysis.report({"combined": _combined()})
    assert "image layer 1, text layer 2: 0.6000" in text and "0.5000 to 0.7000" in text and "p = 0.01" in text
    assert analysis.plots({"combined": _combined()}, tmp_path) == ["crossmodal_heatmap.png", "crossmodal_heatmap.svg"]
    assert (tmp_path / "crossmodal_heatmap.png").stat().st_size > 0
    assert np.isnan(CrossmodalResult.read(_combined()).figures["cka"].value[0, 1])
