"""Figures say what they draw: each band names its interval (a Wilson interval is not a bootstrap one), every PNG's
title names the model and the data, each report.html caption sits under its own chart, and the chance or null line
is drawn where there is one; the lens's rank curve has its interval, its chance line and an axis from 0 (a wiggle
of a tenth is not drawn as a trend). Read from the figures as drawn (tests/figures.py) and from the page's charts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.analyses.rendering import load_results, rerender

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from figures import capture  # noqa: E402


@pytest.fixture(scope="module")
def compositionality(bert_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("comp") / "run"
    run_analysis("compositionality", RunRequest(models=[str(bert_export)], engine="ort", out=out, cache=False,
                                                labels=("tinybert",)))
    return out


@pytest.fixture(scope="module")
def lens(tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("lens") / "run"
    run_analysis("lens", RunRequest(models=[str(tiny_model("bert"))], engine="torch", out=out, cache=False,
                                    labels=("tinybert",), options={"top_k": 3, "show": 0}))
    return out


def _drawn(result_dir: Path, monkeypatch):
    """{PNG name: what it shows} and {PNG name: its y limits}, as re-rendered from results.json."""
    import layerscope.report.plots as plots

    limits: dict[str, tuple[float, float]] = {}
    shown = capture(monkeypatch)
    inner = plots.save

    def save(plt, fig, path):
        limits[Path(path).name] = fig.axes[0].get_ylim()
        return inner(plt, fig, path)

    monkeypatch.setattr(plots, "save", save)
    rerender(result_dir)
    return shown, limits


def _charts(result_dir: Path) -> dict[str, str]:
    """{chart title: its caption and notes, as the page shows them under it} of report.html's declared charts."""
    from layerscope.analyses.rendering import declared_figures
    from layerscope.report.html_views import views

    results = load_results(result_dir)
    return {c.title: " ".join([c.caption, *c.notes]) for s in views(results, declared_figures(results.analysis))
            for c in s.charts}


def test_compositionality_bands_name_their_interval_and_captions_their_chart(compositionality, monkeypatch):
    """Catches: the win rate's Wilson band labelled "95% bootstrap CI", the mean diff's caption under the win
    rate's chart, and titles that name no model or data."""
    shown, _ = _drawn(compositionality, monkeypatch)
    wins, diffs = shown["compositionality_win_rate_by_layer.png"], shown["compositionality_mean_diff_by_layer.png"]
    assert "shaded: 95% Wilson interval" in wins.legends and "chance" in wins.legends
    assert "shaded: 95% bootstrap interval" in diffs.legends
    for png in shown.values():
        assert "bootstrap CI" not in " ".join(png.legends)
        assert "tinybert" in png.title() and "compositionality.jsonl" in png.title(), png.title()
    charts = _charts(compositionality)
    (win,) = [cap for title, cap in charts.items() if "win rate" in title]
    (diff,) = [cap for title, cap in charts.items() if "mean cos" in title]
    assert "Shaded band: 95% Wilson interval" in win and "bootstrap" not in win and "chance is 0.5" in win
    assert "Shaded band: 95% bootstrap interval" in diff and "Wilson" not in diff


def test_the_lens_rank_curve_has_its_interval_chance_line_and_an_axis_from_zero(lens, monkeypatch):
    results = load_results(lens)
    (fig,) = results.per_model.values()
    rows = fig.table("lens_by_layer")
    for r in rows:
        assert r["mean_log10_rank_ci_low"] <= r["mean_log10_rank"] <= r["mean_log10_rank_ci_high"]
        assert r["mean_log10_rank_ci_low"] < r["mean_log10_rank_ci_high"]  # texts of different ranks: a spread
    vocab = load_manifest_vocab(lens)
    by_hand = float(np.mean(np.log10(np.arange(1, vocab + 1, dtype=np.float64))))  # a rank drawn at random
    assert fig.summary["chance_log10_rank"] == pytest.approx(by_hand, rel=1e-9)
    shown, limits = _drawn(lens, monkeypatch)
    rank = shown["lens_rank.png"]
    assert "shaded: 95% bootstrap interval over texts" in rank.legends and "chance" in rank.legends
    assert limits["lens_rank.png"][0] <= 0.0 and limits["lens_rank.png"][1] >= by_hand
    assert "tinybert" in rank.title() and "lens_texts.jsonl (built in)" in rank.title()
    charts = _charts(lens)
    (caption,) = [cap for title, cap in charts.items() if "rank" in title]
    assert "Shaded band: 95% bootstrap interval over texts" in caption and "Dashed line: chance" in caption


def load_manifest_vocab(result_dir: Path) -> int:
    import json

    doc = json.loads((result_dir / "results.json").read_text())
    (model,) = doc["models"].values()
    return int(model["manifest"]["vocab_size"])


def test_a_curve_without_a_declared_band_names_it_from_its_rows():
    """A band the declaration does not name is named from the rows' ``_ci_method`` (or generically), never as a
    kind of interval it is not."""
    from layerscope.report.declared import band_name
    from layerscope.report.figures import Curve, Line

    curve = Curve("t", (Line("x", "x"),), file="f", title="t", ylabel="y")

    def lines(*methods):
        return {str(i): (["0"], [0.5], [0.4], [0.6], "m", m) for i, m in enumerate(methods)}

    assert band_name(curve, lines("wilson")) == "95% Wilson interval"
    assert band_name(curve, lines("bootstrap-percentile", "bootstrap-percentile-pair-terms")) == "95% bootstrap interval"
    assert band_name(curve, lines("wilson", "bootstrap-percentile")) == "95% interval"
    assert band_name(curve, lines(None)) == "95% interval"


def test_a_png_title_names_the_run_once():
    """A declared title that names the models already (``{about}``, ``{model} on {data_name}``) is drawn as it is;
    one that does not gets the models and the data file below it. Catches: steering's titles saying the model and
    its data twice, and a title without them left without them."""
    from types import SimpleNamespace

    from layerscope.report.declared_grids import png_title

    results = SimpleNamespace(per_model={"tinybert": None}, models=("tinybert",), analysis="sts", data_origin=None,
                              default_data=None, settings=SimpleNamespace(data="/data/sts-test.csv"))
    named = "steering at the largest scale, by layer: tinybert on the built-in steering pairs"
    assert png_title(named, results) == named
    assert png_title("STS Spearman (on sts-test.csv)", results) == \
        "STS Spearman (on sts-test.csv)\ntinybert · sts-test.csv"
    two = SimpleNamespace(**{**vars(results), "per_model": {"a": None, "b": None}, "models": ("a", "b")})
    assert png_title("patching: a on pairs.jsonl", two) == "patching: a on pairs.jsonl\na, b · sts-test.csv"
    assert png_title("patching: a on pairs.jsonl", two, model="a") == "patching: a on pairs.jsonl"
