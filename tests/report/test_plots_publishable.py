"""Plots a researcher can publish: CI bands/bars drawn from results.json, readable heat-map text, legends
clear of value labels, titles inside the figure, axis labels naming the data used, SVG beside each PNG."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from layerscope.report import plots  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """Every figure a plot function finishes, kept open for inspection instead of closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    close = plt.close
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def _sts_results(data="/somewhere/my-pairs.tsv", probe=False):
    rows = []
    for p, shift in (("mean", 0.0), ("cls", -0.1)):
        for i, layer in enumerate(["raw", "0", "1", "2"]):
            v = 0.5 + 0.1 * i + shift
            rows.append({"pooling": p, "layer": layer, "spearman": v, "spearman_ci_low": v - 0.02 - 0.01 * i,
                         "spearman_ci_high": v + 0.03, "pearson": v - 0.05, "pearson_ci_low": v - 0.08,
                         "pearson_ci_high": v - 0.01})
    fig = {"summary": {"data": {"source": data}}, "tables": {"layers": rows}}
    if probe:
        fig["probe"] = {"rows": [
            {"name": "probe cosine-mlp", "spearman": 0.84, "spearman_ci_low": 0.82, "spearman_ci_high": 0.86},
            {"name": "best layer on dev (2)", "spearman": 0.83, "spearman_ci_low": 0.80, "spearman_ci_high": 0.85},
            {"name": "final layer (2)", "spearman": 0.82, "spearman_ci_low": 0.79, "spearman_ci_high": 0.845}]}
    return {"analysis": "sts", "settings": {"data": data}, "per_model": {"org/tiny": fig}}


def _ax(fig):
    return fig.axes[0]


def test_sts_layer_curves_have_ci_bands_with_the_saved_interval_ends(tmp_path, figures):
    from layerscope.analyses.sts import STS

    results = _sts_results()
    STS().plots(results, tmp_path)
    ax = _ax(figures[0])  # spearman by layer
    rows = results["per_model"]["org/tiny"]["tables"]["layers"]
    for pooling in ("mean", "cls"):
        bands = [c for c in ax.collections if c.get_gid() == f"ci:{pooling}"]
        assert len(bands) == 1, f"no CI band drawn for {pooling}"
        verts = bands[0].get_paths()[0].vertices
        for x, r in enumerate(r for r in rows if r["pooling"] == pooling):
            ys = verts[np.isclose(verts[:, 0], x)][:, 1]
            assert np.isclose(ys.min(), r["spearman_ci_low"]) and np.isclose(ys.max(), r["spearman_ci_high"])
    assert any(t.get_text().startswith("shaded: 95% ") and "interval" in t.get_text()
               for t in ax.get_legend().get_texts())


def test_axis_label_names_the_data_file_the_results_record(tmp_path, figures):
    from layerscope.analyses.sts import STS

    STS().plots(_sts_results(data="/data/sickr-dev.csv", probe=True), tmp_path)
    labels = [_ax(f).get_ylabel() for f in figures]
    assert labels == ["Spearman (on sickr-dev.csv)", "Pearson (on sickr-dev.csv)", "Spearman (on sickr-dev.csv)"]
    assert "test" not in _ax(figures[2]).get_title()


def test_probe_bars_have_error_bars_and_labels_above_them(tmp_path, figures):
    from layerscope.analyses.sts import STS

    results = _sts_results(probe=True)
    STS().plots(results, tmp_path)
    ax = _ax(figures[-1])
    for r in results["per_model"]["org/tiny"]["probe"]["rows"]:
        cols = [c for c in ax.collections if c.get_gid() == f"ci:org/tiny:{r['name']}"]
        assert len(cols) == 1, f"no error bar for {r['name']}"
        (seg,) = cols[0].get_segments()
        assert sorted(seg[:, 1]) == pytest.approx([r["spearman_ci_low"], r["spearman_ci_high"]])
        label = next(t for t in ax.texts if t.get_text() == f"{r['spearman']:.3f}")
        assert label.xy[1] >= r["spearman_ci_high"] - 1e-12  # sits on top of the interval, not inside it


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("n_labels", [1, 4])
def test_legend_never_covers_value_labels_or_the_axes(tmp_path, figures, n_labels):
    # values near the top right are where a default 'best' legend lands on the labels
    groups = {f"variant {g}": {f"method {j}": 0.9 + 0.02 * j for j in range(n_labels)} for g in range(3)}
    plots.bars(tmp_path / "b.png", groups, title="retention", ylabel="retention")
    fig = figures[0]
    ax = _ax(fig)
    renderer = fig.canvas.get_renderer()
    texts = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(texts) == 3 * n_labels
    if n_labels == 1:  # a single bar per group is named in the title; no legend box at all
        assert ax.get_legend() is None and ax.get_title().endswith("method 0")
    else:
        legend = ax.get_legend().get_window_extent(renderer)
        assert not any(_overlaps(legend, t) for t in texts)
        assert not _overlaps(legend, ax.get_window_extent(renderer))
    # value labels of neighbouring bars do not run into each other either
    for i, a in enumerate(texts):
        assert not any(_overlaps(a, b) for b in texts[i + 1:])


@pytest.mark.parametrize("vmin,vmax", [(0.0, 1.0), (-0.2, 1.0)])
def test_heatmap_text_contrasts_with_its_cell_for_low_mid_and_high_values(tmp_path, figures, vmin, vmax):
    m = [[vmin, (vmin + vmax) / 2], [vmax, float("nan")]]
    plots.heatmap(tmp_path / "h.png", m, ["a", "b"], ["a", "b"], title="CKA", vmin=vmin, vmax=vmax)
    ax = _ax(figures[0])
    im = ax.images[0]
    from matplotlib.colors import to_rgb

    assert len(ax.texts) == 3
    for t in ax.texts:
        j, i = t.get_position()
        cell = im.cmap(im.norm(np.asarray(m)[int(i), int(j)]))
        assert plots.contrast_ratio(cell, to_rgb(t.get_color())) >= 4.5, (t.get_text(), t.get_color())


def test_text_colour_rule():
    assert plots.text_color_for((0.993, 0.906, 0.144)) == "black"  # viridis yellow
    assert plots.text_color_for((0.267, 0.005, 0.329)) == "white"  # viridis purple
    assert plots.contrast_ratio((0, 0, 0), (1, 1, 1)) == pytest.approx(21.0)


def test_bench_title_stays_inside_the_figure(tmp_path, figures):
    from layerscope.bench.report import bar_plot

    bench = {"model": {"source": "sentence-transformers/paraphrase-multilingual-mpnet-base-v2-very-long-name"},
             "corpus": {"texts": 123456}, "settings": {"layers": list(range(13)), "pooling": "mean"},
             "results": [{"available": True, "engine": e, "texts_per_s": s, "kind": k, "speedup_vs_hf_eager": x}
                         for e, s, k, x in (("hf-eager", 100.0, "baseline", 1.0), ("ort", 250.0, "engine", 2.5))]}
    bar_plot(bench, tmp_path / "bench.png")
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    title = _ax(fig).title.get_window_extent(renderer)
    box = fig.bbox
    assert title.x0 >= box.x0 and title.x1 <= box.x1 and title.y1 <= box.y1
    assert "paraphrase-multilingual" in _ax(fig).get_title()
    assert (tmp_path / "bench.svg").exists()


def test_the_bench_figure_names_the_machine_and_load_it_was_measured_on(tmp_path, figures):
    """Each row in its own process: the loads recorded at the processes' starts; one process for every row:
    the loads each row recorded before and after it."""
    from layerscope.bench.report import bar_plot

    machine = {"cpu_model": "Some CPU 9000", "usable_cores": 16, "physical_cores": 32,
               "cpu_flags": ["avx2", "avx512_bf16"], "gpu": "none"}
    base = {"model": {"source": "m"}, "corpus": {"texts": 10}, "settings": {"layers": [0, 1], "pooling": "mean"}}
    isolated = {**base, "machine": {**machine, "load_avg_1m_at_starts": [0.42, 3.25, 1.0]},
                "results": [{"available": True, "engine": e, "texts_per_s": 5.0, "kind": "engine",
                             "load_avg_1m": [9.0]} for e in ("hf-eager", "ort")]}
    in_flight = {**base, "machine": machine,
                 "results": [{"available": True, "engine": e, "texts_per_s": 5.0, "kind": "engine",
                              "load_avg_1m": loads} for e, loads in (("hf-eager", [0.42, 0.6]), ("ort", [1.0, 3.25]))]}
    for bench, load in ((isolated, "at row starts 0.4-3.2"), (in_flight, "around the rows 0.4-3.2")):
        bar_plot(bench, tmp_path / "bench.png")
        (text,) = [t for t in figures[-1].texts if t.get_gid() == "machine"]
        assert " ".join(text.get_text().split()) == ("Some CPU 9000, 16 cores; avx2 avx512_bf16; GPU: none; "
                                                     f"load (1 min) {load}")
        box, renderer = figures[-1].bbox, figures[-1].canvas.get_renderer()
        assert text.get_window_extent(renderer).x1 <= box.x1  # wrapped inside the figure's width


def test_every_png_has_a_parseable_svg_beside_it(tmp_path):
    from layerscope.analyses.sts import STS

    names = STS().plots(_sts_results(probe=True), tmp_path)
    assert len(names) == 3
    for name in names:
        png = tmp_path / name
        svg = png.with_suffix(".svg")
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")


def test_a_narrow_heat_map_keeps_a_long_model_id_whole_inside_its_title(tmp_path, figures):
    """Four columns leave room for fewer characters than a hub id has: the title wraps between words and then
    shrinks its font, never cutting ``org/name`` in two, and stays inside the figure."""
    model = "sentence-transformers/all-MiniLM-L6-v2"
    plots.heatmap(tmp_path / "h.png", np.arange(28.0).reshape(7, 4), [str(i) for i in range(7)],
                  ["1", "2", "4", "8"], title=f"random direction of the same norm: projection, {model} on the "
                                              "built-in steering pairs")
    fig = figures[-1]
    title = _ax(fig).title
    assert model in title.get_text().split("\n"), title.get_text()
    box = title.get_window_extent(fig.canvas.get_renderer())
    assert box.x0 >= fig.bbox.x0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1
