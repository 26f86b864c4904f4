"""Two local models side by side: each is called by a short label in the terminal, the PNG legends and
report.md/report.html, and the PNGs and report.html put models of different depth on one depth axis."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from cli_helpers import run_cli
from figures import capture


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def two_depths(tiny_model, tmp_path_factory):
    """The tiny bert (2 layers) and a 4-layer bert, in folders whose paths differ only near the end."""
    import tiny_models

    root = tmp_path_factory.mktemp("side") / "experiments-on-a-long-shared-path-prefix"
    shallow = root / "run-a" / "checkpoint-final"
    shutil.copytree(tiny_model("bert"), shallow)
    deep = root / "run-b" / "checkpoint-final"
    before = tiny_models.LAYERS
    tiny_models.LAYERS = 4
    try:
        tiny_models.build_tiny_model("bert", deep, seed=1)
    finally:
        tiny_models.LAYERS = before
    return shallow, deep


def _pairs(path, n=30):
    rng = np.random.default_rng(5)
    words = "the a cat dog man woman plays runs sits reads on in park house guitar book food river".split()
    lines = []
    for i in range(n):
        a = list(rng.choice(words, size=int(rng.integers(3, 8))))
        b = list(a) if i % 2 == 0 else list(rng.choice(words, size=int(rng.integers(3, 8))))
        lines.append(f"g\tf\t2020\t{i:04d}\t{round(float(rng.integers(0, 26)) * 0.2, 1)}\t{' '.join(a)}\t"
                     f"{' '.join(b)}\n")
    path.write_text("".join(lines))
    return path


def test_default_labels_are_the_folders_last_parts(two_depths):
    from layerscope.analyses.labels import model_labels

    shallow, deep = two_depths
    assert model_labels([str(shallow), str(deep)], [None, None]) == ["run-a/checkpoint-final",
                                                                      "run-b/checkpoint-final"]
    assert model_labels([str(shallow), "org/name", "minilm"], [None, None, "minilm"]) == [
        "checkpoint-final", "org/name", "minilm"]
    assert model_labels([str(shallow), str(shallow)], [None, None]) == ["checkpoint-final", "checkpoint-final#2"]


def test_labels_are_checked_before_any_work(two_depths, capsys):
    shallow, deep = two_depths
    code, text = run_cli(["run", "sts", "--model", shallow, "--model", deep, "--label", "only-one"], capsys)
    assert code == 2 and "give one --label per --model, in the same order: 2 model(s), 1 label(s)" in text
    code, text = run_cli(["run", "sts", "--model", shallow, "--model", deep, "--label", "x", "--label", "x"], capsys)
    assert code == 2 and "--label 'x' is given to more than one model" in text


def test_two_models_are_named_by_label_everywhere_on_one_depth_axis(two_depths, tmp_path, capsys, monkeypatch):
    shallow, deep = two_depths
    shown = capture(monkeypatch)
    out = tmp_path / "r"
    code, text = run_cli(["run", "sts", "--model", shallow, "--model", deep, "--label", "shallow",
                          "--label", "deep", "--engine", "torch", "--pooling", "mean", "--n-boot", "50",
                          "--data", _pairs(tmp_path / "pairs.tsv"), "--out", out, "--no-cache"], capsys)
    assert code == 0, text
    # the terminal (80 columns): both models named whole in the side-by-side header, never cut to a prefix
    assert "…" not in text and "experiments-on-a-long" not in text.split("models side by side")[1], text
    header = text.split("models side by side")[1]
    assert "shallow" in header and "deep" in header
    # the PNG legends name the labels, never a path
    sts_png = shown["sts_spearman_by_layer.png"]
    assert sts_png.legends[:2] == ["shallow mean", "deep mean"], sts_png.legends
    assert not any("/" in entry for entry in sts_png.legends)
    # one depth axis: 2 and 4 layers, so the PNG is drawn at relative depth, as report.html is
    assert sts_png.xlabels[0] == "relative depth (layer / number of layers)"
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "relative depth (layer / number of layers)" in page
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "## shallow" in md and "## deep" in md and "| shallow (layer: score) | deep (layer: score) |" in md
    assert re.search(r"\bshallow\b", page) and re.search(r"\bdeep\b", page)
    import json

    results = json.loads((out / "results.json").read_text())
    assert list(results["per_model"]) == ["shallow", "deep"]
    assert results["models"]["deep"]["spec"] == str(deep)  # the full path is kept where it belongs


def test_models_of_one_depth_share_the_layer_axis_in_png_and_html(tiny_model, tmp_path, monkeypatch):
    """Two models of the same depth: the layer axis in both (report.html used relative depth for any two)."""
    from layerscope.analyses.base import RunRequest, run_analysis

    shown = capture(monkeypatch)
    a = tmp_path / "x" / "bert-a"
    shutil.copytree(tiny_model("bert"), a)
    out = tmp_path / "same"
    run_analysis("compositionality", RunRequest(models=[str(a), str(tiny_model("bert"))], engine="torch",
                                                layers="1,2", out=out, cache=False, poolings=["mean"],
                                                labels=["one", "two"]))
    png = shown["compositionality_win_rate_by_layer.png"]
    assert png.xlabels[0] == "layer" and png.xticks[0] == ["1", "2"]
    assert png.legends[:2] == ["one mean", "two mean"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "relative depth (layer / number of layers)" not in page
