"""report.html's parts without a browser: the escaping helpers, the relative-depth axis, the alignment neighbours
the browser shows, and a missing plotly."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

pytest.importorskip("plotly")


def test_script_json_cannot_close_its_script_element():
    from layerscope.report.html_page import script_json

    value = {"a</script><script>alert(1)</script>": ["<!-- & -->", "\u2028"]}
    text = script_json(value)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == value


def test_table_cells_are_escaped_and_numbers_formatted():
    from layerscope.report.html_page import html_table

    page = html_table([{"name": "<b onmouseover=x>", "p": 3.2e-9, "n": 1234, "r": 0.81234567, "none": None}])
    assert "<b onmouseover" not in page and "&lt;b onmouseover=x&gt;" in page
    assert ">3.20e-09<" in page and ">1,234<" in page and ">0.8123<" in page and ">–<" in page


def test_relative_depth_puts_each_model_at_layer_over_its_depth():
    from layerscope.report.html_figures import Series, layer_curves

    chart = layer_curves([Series("deep", ["raw", "0", "3", "6"], [0.1, 0.2, 0.3, 0.4], num_layers=6),
                          Series("shallow", ["0", "1", "2"], [0.5, None, 0.7], num_layers=2)],
                         title="t", caption="c", ylabel="y", relative=True)
    lines = {t["name"]: t for t in chart.figure["data"]}
    assert lines["deep"]["x"] == pytest.approx([0.0, 0.5, 1.0])  # raw has no block number: left out
    assert lines["deep"]["y"] == pytest.approx([0.2, 0.3, 0.4])
    assert lines["shallow"]["x"] == pytest.approx([0.0, 0.5, 1.0]) and lines["shallow"]["y"][1] is None
    assert any("raw" in n for n in chart.notes)


def test_a_long_chart_title_is_wrapped_not_cut():
    """Catches: a title naming the model, data and pooling (130 characters) drawn on one line, cut at the
    chart's right edge; its words lost or reordered by the wrapping; no room made above the plot for it."""
    from layerscope.report.html_figures import Series, layer_curves

    title = ("intrinsic dimension (TwoNN), texts vs shuffled tokens (sentence-transformers/all-MiniLM-L6-v2; "
             "generated English (60 texts), mean pooling)")
    short = layer_curves([Series("m", ["0", "1"], [0.5, 0.6])], title="t", caption="c", ylabel="y").figure["layout"]
    long = layer_curves([Series("m", ["0", "1"], [0.5, 0.6])], title=title, caption="c", ylabel="y")
    layout = long.figure["layout"]
    lines = layout["title"]["text"].split("<br>")
    assert len(lines) == 2 and all(line.startswith("<b>") and line.endswith("</b>") for line in lines)
    words = [line[3:-4] for line in lines]
    assert all(len(w) <= 100 for w in words) and " ".join(words) == title
    assert layout["margin"]["t"] == short["margin"]["t"] + 20 and layout["height"] == short["height"] + 20


def test_band_follows_the_interval_columns():
    from layerscope.report.html_figures import Series, layer_curves

    chart = layer_curves([Series("m", ["0", "1", "2"], [0.5, 0.6, 0.7], [0.4, None, 0.6], [0.55, None, 0.8])],
                         title="t", caption="c", ylabel="y")
    (band,) = [t for t in chart.figure["data"] if t.get("fill") == "toself"]
    # the polygon runs along the highs and back along the lows, skipping the layer without an interval
    assert band["x"] == ["0", "2", "2", "0"] and band["y"] == pytest.approx([0.55, 0.8, 0.6, 0.4])


def test_nearest_targets_are_the_exact_cosine_neighbours():
    from layerscope.analyses.alignment import example_queries, nearest_targets

    rng = np.random.default_rng(0)
    src, tgt = rng.normal(size=(40, 16)), rng.normal(size=(40, 16)) * 3.0
    queries = example_queries(40, 7, seed=1)
    assert list(queries) == sorted(queries) and len(set(queries)) == 7
    assert list(example_queries(5, 50, seed=1)) == [0, 1, 2, 3, 4]
    got = nearest_targets(src, tgt, queries, 5, block=7)  # targets read in 6 blocks, merged
    cos = (src / np.linalg.norm(src, axis=1, keepdims=True)) @ (tgt / np.linalg.norm(tgt, axis=1, keepdims=True)).T
    for row, q in enumerate(queries):
        want = np.argsort(-cos[q])[:5]
        assert got["ids"][row] == want.tolist()
        assert got["scores"][row] == pytest.approx(cos[q, want], abs=1e-4)


def test_without_plotly_report_html_is_skipped_with_one_warning(tmp_path, monkeypatch, caplog):
    import sys

    from layerscope.report.html_page import write_html_report

    monkeypatch.setitem(sys.modules, "plotly", None)
    with caplog.at_level(logging.WARNING, logger="layerscope"):
        assert write_html_report(tmp_path, {"analysis": "sts"}) is None
    assert not (tmp_path / "report.html").exists()
    assert [r.getMessage() for r in caplog.records] == ["report.html not written: it needs plotly (pip install plotly)"]


def test_unknown_analysis_still_gets_a_page():
    from layerscope.report.html_page import build_page

    results = {"analysis": "custom", "description": "a new analysis", "main_score": "score",
               "settings": {"data": "x.csv"}, "models": {"m": {"manifest": {"num_layers": 2}}},
               "per_model": {"m": {"summary": {"score": 0.5},
                                   "tables": {"t": [{"layer": str(i), "score": 0.1 * i} for i in range(3)]}}}}
    page = build_page(results)
    assert "custom: a new analysis" in page and "score by layer (t)" in page and "x.csv" in page


def test_alignment_examples_option_is_checked_before_any_model_loads(tmp_path):
    from layerscope.analyses.base import RunRequest, run_analysis
    from layerscope.errors import InputError

    with pytest.raises(InputError, match="--examples must be at least 0, got -1"):
        run_analysis("alignment", RunRequest(models=["no-such-model"], out=tmp_path / "a",
                                             options={"generate": "zh-en", "examples": -1}))
