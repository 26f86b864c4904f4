"""Declared heat maps and grouped bars (report/figures.py ``HeatMap``, ``Bars``): one declaration drawn to PNG,
report.md, report.html and the console with the values of results.json, one colour scale where declared, and a
matrix cell that is not a number refused on load."""

from __future__ import annotations

import io
import json

import pytest

from layerscope.analyses import registry as analyses_registry
from layerscope.analyses.base import Analysis, AnalysisMetadata, rerender
from layerscope.analyses.rendering import load_results, print_summary
from layerscope.errors import InputError
from layerscope.report.declared import sections
from layerscope.report.declared_grids import bar_groups
from layerscope.report.figures import Bars, Figures, HeatMap, Line
from layerscope.report.results import Results

A = [[1.0, 0.25], [0.25, 1.0]]
B = [[1.0, -0.5], [None, 1.2]]

FIGURES = Figures(
    heatmaps=(HeatMap("cka", "cka", title="CKA of {model} ({about})", zlabel="CKA", scale=(0.0, 1.0), markdown=True),
              HeatMap("cka", "cross_cka", title="{model_a} vs {model_b}", zlabel="CKA", rows="layers_a",
                      cols="layers_b", block="cross", scale=(0.0, 1.0))),
    bars=(Bars("probe.rows", "name", (Line("spearman", "Spearman"),), file="probe_bars", title="probes",
               ylabel="Spearman"),),
    about=lambda results: "on texts")


class _Grids(Analysis):
    metadata = AnalysisMetadata(name="grids-probe", description="test only", inputs=(), main_score="x",
                                figures=FIGURES)

    def compute(self, ctx, run, data):
        return {}


def _doc() -> dict:
    def model(matrix, rho):
        return {"summary": {"x": 1}, "tables": {}, "layers": ["0", "1"], "cka": matrix,
                "probe": {"rows": [{"name": "probe mlp", "spearman": rho, "spearman_ci_low": rho - 0.1,
                                    "spearman_ci_high": rho + 0.1},
                                   {"name": "final layer (2)", "spearman": rho / 2},
                                   {"name": "nothing", "spearman": None}]}}

    return {"format": 1, "analysis": "grids-probe", "description": "probe", "main_score": "x", "seconds": 1.0,
            "settings": {}, "models": {"a": {"manifest": {"num_layers": 1}}, "b": {"manifest": {"num_layers": 1}}},
            "per_model": {"a": model(A, 0.8), "b": model(B, 0.6)},
            "combined": {"cross": {"model_a": "a", "model_b": "b", "layers_a": ["0", "1"], "layers_b": ["0"],
                                   "cka": [[0.5], [0.9]]}}}


@pytest.fixture
def grids_probe(monkeypatch):
    analyses_registry.registry()
    monkeypatch.setitem(analyses_registry._REGISTRY, "grids-probe", _Grids)


def test_heat_maps_share_one_colour_scale_and_keep_each_value(tmp_path, grids_probe):
    pytest.importorskip("plotly")
    out = tmp_path / "r"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(_doc()), encoding="utf-8")
    rendered = rerender(out)
    assert {"cka_0.png", "cka_1.png", "cross_cka.png", "probe_bars.png"} <= set(rendered.plots)
    (section,) = [s for s in sections(FIGURES, load_results(out)) if s.anchor == "figures"]
    maps = [c for c in section.charts if c.kind == "heatmap"]
    assert [c.title for c in maps] == ["CKA of a (on texts)", "CKA of b (on texts)", "a vs b"]
    z = [c.figure["data"][0]["z"] for c in maps]
    assert z == [A, B, [[0.5], [0.9]]]
    # the least range 0..1 widened to the lowest (-0.5, in b) and the highest (1.2, in b) value of every map
    assert {(c.figure["data"][0]["zmin"], c.figure["data"][0]["zmax"]) for c in maps} == {(-0.5, 1.2)}
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "one colour scale, -0.5 to 1.2" in md
    assert "| 0 | 1.00 | 0.25 |" in md and "| 1 | - | 1.20 |" in md  # markdown=True: the matrix as a table
    from rich.console import Console

    buf = io.StringIO()
    print_summary(_Grids(), load_results(out), Console(file=buf, width=120, color_system=None))
    assert "CKA of b (on texts)" in buf.getvalue() and "-0.50" in buf.getvalue()


def test_grouped_bars_one_group_per_row_name_one_bar_per_model():
    groups, errors = bar_groups(FIGURES.bars[0], Results.from_document(_doc(), "test"))
    assert groups == {"probe mlp": {"a": 0.8, "b": 0.6}, "final layer (2)": {"a": 0.4, "b": 0.3}}
    assert errors["probe mlp"]["a"] == pytest.approx((0.7, 0.9))
    assert "final layer (2)" not in errors  # no interval in those rows: no whisker
    one = _doc()
    del one["per_model"]["b"]
    groups, _ = bar_groups(FIGURES.bars[0], Results.from_document(one, "test"))
    assert groups == {"probe mlp": {"Spearman": 0.8}, "final layer (2)": {"Spearman": 0.4}}


def test_grouped_bars_are_drawn_on_the_page():
    pytest.importorskip("plotly")
    (section,) = [s for s in sections(FIGURES, Results.from_document(_doc(), "test")) if s.anchor == "figures"]
    (chart,) = [c for c in section.charts if c.kind == "bars"]
    ys = {t["name"]: t["y"] for t in chart.figure["data"]}
    assert ys == {"a": [0.8, 0.4], "b": [0.6, 0.3]}


@pytest.mark.parametrize("cell", ["0.5", True, [1]])
def test_a_heat_map_cell_that_is_not_a_number_is_refused_on_load(tmp_path, grids_probe, cell):
    doc = _doc()
    doc["per_model"]["b"]["cka"][1][0] = cell
    (tmp_path / "results.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(InputError, match=r"per_model\.b\.cka\[1\]\[0\]"):
        load_results(tmp_path)
