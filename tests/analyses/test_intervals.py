"""Bootstrap 95% intervals of the headline figures: the interval functions against a hand-written bootstrap and
known values; intervals present in results.json (compositionality, alignment, lens, saliency), seeded by the
run's seed; drawn as bands, whiskers and references in the PNGs; written in report.md and report.html."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from layerscope.analyses.base import RunRequest, run_analysis
from layerscope.analyses.intervals import interval, mean_interval
from layerscope.metrics.paired import mean_scorer, ratio_scorer, win_rate_scorer


def _hand_bootstrap(statistic, n: int, n_resamples: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap written out: resample item indices with the seeded generator, take the 2.5% and
    97.5% quantiles (linear interpolation) of the statistic over the resamples."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, (n_resamples, n))
    stats = np.array([statistic(row) for row in idx])
    lo, hi = np.quantile(stats, [0.025, 0.975])
    return float(lo), float(hi)


def test_mean_interval_is_the_hand_written_percentile_bootstrap():
    values = np.random.default_rng(1).normal(0.3, 1.0, 37)
    got = mean_interval(values, seed=7, n_resamples=500)
    want = _hand_bootstrap(lambda idx: values[idx].mean(), 37, 500, 7)
    assert got == pytest.approx(want, abs=1e-12)


def test_win_rate_and_ratio_intervals_are_the_hand_written_bootstrap():
    diffs = np.random.default_rng(2).normal(0.1, 1.0, 41)
    got = interval(win_rate_scorer(diffs), 41, seed=3, n_resamples=400)
    assert got == pytest.approx(_hand_bootstrap(lambda idx: (diffs[idx] > 0).mean(), 41, 400, 3), abs=1e-12)
    hits = np.array([3, 0, 5, 2, 7, 1, 4])
    positions = np.array([4, 2, 6, 5, 9, 3, 4])
    got = interval(ratio_scorer(hits, positions), 7, seed=5, n_resamples=300)
    want = _hand_bootstrap(lambda idx: hits[idx].sum() / positions[idx].sum(), 7, 300, 5)
    assert got == pytest.approx(want, abs=1e-12)


def test_interval_known_values():
    assert mean_interval(np.full(20, 0.25), seed=0) == (0.25, 0.25)  # no spread: the interval is the value
    # a share of 0.3 over 2000 items: the bootstrap interval is close to the normal one, p +- 1.96 sqrt(p(1-p)/n)
    ones = np.zeros(2000)
    ones[:600] = 1.0
    lo, hi = mean_interval(ones, seed=0, n_resamples=2000)
    half = 1.96 * np.sqrt(0.3 * 0.7 / 2000)
    assert lo == pytest.approx(0.3 - half, abs=0.004) and hi == pytest.approx(0.3 + half, abs=0.004)
    assert np.isnan(ratio_scorer([1, 2], [0, 0])(np.array([0, 1])))  # no position counted: no share


def test_same_seed_same_interval_other_seed_other_interval():
    values = np.random.default_rng(4).normal(size=30)
    assert mean_interval(values, seed=1) == mean_interval(values, seed=1)
    assert mean_interval(values, seed=1) != mean_interval(values, seed=2)


def test_figures_in_prose_have_a_few_significant_digits():
    from layerscope.report.writer import ci, sig

    assert sig(27.481466671788475) == "27.5"
    assert sig(0.012345) == "0.0123"
    assert sig(12345.6) == "12346"
    assert sig(None) == "undefined"
    assert ci(0.1, 0.234567) == " [0.100, 0.235]" and ci(None, 0.2) == ""


def test_lens_intervals_resample_texts_not_positions():
    from layerscope.analyses.lens import add_text_intervals

    positions = np.array([5, 3, 8, 2])
    agree = np.array([[4, 5], [1, 3], [6, 8], [2, 2]])
    top1 = np.array([[0, 1], [0, 0], [1, 2], [0, 1]])
    rows = [{"layer": "0", "top1_agrees_with_last": 13 / 18, "top1_is_target": 1 / 18},
            {"layer": "1", "top1_agrees_with_last": 1.0, "top1_is_target": 4 / 18}]
    add_text_intervals(rows, positions, agree, top1, seed=9)
    want = _hand_bootstrap(lambda idx: agree[idx, 0].sum() / positions[idx].sum(), 4, 1000, 9)
    assert (rows[0]["top1_agrees_with_last_ci_low"], rows[0]["top1_agrees_with_last_ci_high"]) == pytest.approx(want)
    assert rows[0]["top1_agrees_with_last_ci_method"] == "bootstrap-percentile"
    # a share of 1 (every position of every text): no bootstrap spread, so Wilson with the 4 texts as trials
    from scipy.stats import binomtest

    want = binomtest(4, 4).proportion_ci(method="wilson")
    assert (rows[1]["top1_agrees_with_last_ci_low"], rows[1]["top1_agrees_with_last_ci_high"]) == pytest.approx(
        (want.low, want.high))
    assert rows[1]["top1_agrees_with_last_ci_method"] == "wilson-texts"


def test_saliency_paired_tests_between_methods():
    from layerscope.analyses.saliency import method_tests

    rng = np.random.default_rng(0)
    base = rng.normal(size=12)
    per_text = {"decoded@1": {"hide": list(base + 1.0)}, "grad-x-input": {"hide": list(base)},
                "integrated-gradients": {"hide": list(base + rng.normal(0, 0.5, 12))},
                "random": {"hide": list(rng.normal(size=12))}}
    rows = {(r["method_a"], r["method_b"]): r for r in method_tests(per_text, "decoded@1", seed=0)}
    exact = rows["decoded@1", "grad-x-input"]  # the same texts shifted by 1: difference 1, no spread
    assert exact["difference"] == pytest.approx(1.0)
    assert exact["ci_low"] == pytest.approx(1.0) and exact["ci_high"] == pytest.approx(1.0)
    assert exact["p_value"] == 0.0  # every resample above 0
    assert set(rows) == {("decoded@1", "grad-x-input"), ("decoded@1", "integrated-gradients"),
                         ("decoded@1", "random"), ("grad-x-input", "random"), ("integrated-gradients", "random")}


# -- real runs on tiny models --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def torch_one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run(name, tiny_model, out, family="bert", **kw):
    kw.setdefault("layers", "all")
    return run_analysis(name, RunRequest(models=[str(tiny_model(family))], engine="torch", out=out, cache=False, **kw))


def _brackets(row, key):
    lo, hi = row[f"{key}_ci_low"], row[f"{key}_ci_high"]
    assert lo is not None and hi is not None, f"{key} has no interval in {row}"
    assert lo - 1e-12 <= row[key] <= hi + 1e-12, (key, lo, row[key], hi)
    return lo, hi


def _every_interval_names_its_method(results):
    """Every ``x_ci_low`` in a row of results.json has ``x_ci_method`` beside it; every headline a ci_method."""
    seen = 0
    for fig in results["per_model"].values():
        for table in fig.get("tables", {}).values():
            for row in table:
                for key in [k for k in row if k.endswith("_ci_low")]:
                    assert row.get(key[:-len("_ci_low")] + "_ci_method"), (key, row)
                    seen += 1
        for h in fig["summary"].get("headline", []):
            assert h["ci_low"] is None or h["ci_method"], h
    assert seen


def test_compositionality_results_hold_seeded_intervals(tiny_model, tmp_path, torch_one_thread):
    out, results = _run("compositionality", tiny_model, tmp_path / "a", poolings=["mean", "cls"], seed=0)
    fig = next(iter(results["per_model"].values()))
    rows = fig["tables"]["layers"]
    for r in rows:
        if r["ties"] == r["n_items"]:  # undefined: no figure, no interval
            assert r["win_rate"] is None and r["win_rate_ci_low"] is None and r["mean_diff_ci_high"] is None
            continue
        _brackets(r, "win_rate")
        _brackets(r, "mean_diff")
    best = fig["summary"]["best"]
    assert best["win_rate_ci_low"] is not None and fig["summary"]["headline"][0]["ci_low"] is not None
    tied = [r for r in rows if r["ties"] == r["n_items"]]
    assert tied, "the tiny model's cls at raw/0 gives every item a tie"
    from scipy.stats import binomtest

    defined = [r for r in rows + fig["tables"]["groups"] if r["ties"] != r["n_items"]]
    assert defined and all(r["win_rate_ci_low"] is None for r in fig["tables"]["groups"] if r not in defined)
    for r in defined:  # win rates: Wilson intervals (all-tie rows are undefined, without an interval)
        want = binomtest(r["wins"], r["n_items"]).proportion_ci(method="wilson")
        assert (r["win_rate_ci_low"], r["win_rate_ci_high"]) == pytest.approx((want.low, want.high), abs=1e-12)
        assert r["win_rate_ci_method"] == "wilson"
    _every_interval_names_its_method(json.loads((out / "results.json").read_text()))
    assert (best["pooling"], best["layer"]) not in {(r["pooling"], r["layer"]) for r in tied}
    saved = json.loads((out / "results.json").read_text())
    assert saved["per_model"][next(iter(saved["per_model"]))]["tables"]["layers"][0]["mean_diff_ci_low"] is not None
    # the same settings give the same intervals; another seed other ones
    _, again = _run("compositionality", tiny_model, tmp_path / "b", poolings=["mean", "cls"], seed=0)
    _, other = _run("compositionality", tiny_model, tmp_path / "c", poolings=["mean", "cls"], seed=1)
    ci = [(r["mean_diff_ci_low"], r["mean_diff_ci_high"]) for r in rows]
    assert ci == [(r["mean_diff_ci_low"], r["mean_diff_ci_high"])
                  for r in next(iter(again["per_model"].values()))["tables"]["layers"]]
    assert ci != [(r["mean_diff_ci_low"], r["mean_diff_ci_high"])
                  for r in next(iter(other["per_model"].values()))["tables"]["layers"]]
    md = (out / "report.md").read_text()
    assert "## Headline figures" in md and f"mean diff {best['mean_diff']}" not in md
    assert re.search(r"win rate \S+ \[\S+, \S+\], mean diff \S+ \[\S+, \S+\]", md)
    page = (out / "report.html").read_text()
    assert "95% interval" in page and "best.win_rate" not in page


def test_alignment_results_hold_intervals_and_chance(tiny_model, tmp_path, torch_one_thread):
    out, results = _run("alignment", tiny_model, tmp_path / "a",
                        options={"generate": "zh-en", "n": 24, "permutations": 20, "examples": 2})
    fig = next(iter(results["per_model"].values()))
    for r in fig["tables"]["alignment_layers"]:
        for key in ("acc@1_src2tgt", "acc@5_src2tgt", "acc@10_tgt2src", "mrr_src2tgt", "mrr_tgt2src"):
            _brackets(r, key)
        if r["z"] is not None:
            _brackets(r, "z")
            _brackets(r, "effect")
            assert r["z_ci_method"] == "bootstrap-percentile-pair-terms" and r["acc@1_src2tgt_ci_method"] == "wilson"
    _every_interval_names_its_method(json.loads((out / "results.json").read_text()))
    assert "not an interval for a population z" in fig["summary"]["intervals"]
    s = fig["summary"]
    assert s["chance"]["acc@1"] == pytest.approx(1 / 24)
    assert s["chance"]["mrr"] == pytest.approx(np.mean(1 / np.arange(1, 25)))
    assert {h["figure"] for h in s["headline"]} >= {"z, last layer", "best z"}
    md = (out / "report.md").read_text()
    prose = next(line for line in md.splitlines() if line.startswith("Last layer"))
    assert not re.search(r"\d\.\d{6,}", prose), prose  # no figure printed with every digit it has
    assert re.search(r"z = \S+ \[\S+, \S+\]", prose)


# -- drawn: PNGs and report.html from results ------------------------------------------------------------

@pytest.fixture
def figures(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    close = plt.close
    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    for fig in kept:
        close(fig)


def _comp_results():
    rows = []
    for p in ("mean", "cls"):
        for i, layer in enumerate(["raw", "0", "1", "2"]):
            tie = p == "cls" and layer in ("raw", "0")
            w = 0.0 if tie else 0.4 + 0.1 * i
            rows.append({"pooling": p, "layer": layer, "n_items": 20, "ties": 20 if tie else 0, "wins": 0, "losses": 0,
                         "win_rate": w, "win_rate_ci_low": None if tie else w - 0.1,
                         "win_rate_ci_high": None if tie else w + 0.1, "mean_diff": 0.0 if tie else 0.01 * i,
                         "mean_diff_ci_low": None if tie else 0.01 * i - 0.005,
                         "mean_diff_ci_high": None if tie else 0.01 * i + 0.005, "sign_p": 0.5,
                         "mean_paraphrase": 0.5, "mean_negative": 0.5})
    heads = [{"figure": "best win rate", "value": 0.7, "ci_low": 0.6, "ci_high": 0.8, "where": "layer 2, mean pooling",
              "chance": 0.5}]
    summary = {"items": 20, "best_win_rate": 0.7, "headline": heads, "intervals": "95% percentile bootstrap",
               "best": {"pooling": "mean", "layer": "2", "win_rate": 0.7, "mean_diff": 0.02, "sign_p": 0.1}}
    return {"analysis": "compositionality", "main_score": "best_win_rate", "settings": {},
            "models": {"m": {"manifest": {"num_layers": 2}}},
            "per_model": {"m": {"summary": summary, "tables": {"layers": rows, "groups": []}}}}


def test_compositionality_plot_draws_bands_and_leaves_all_tie_layers_out(tmp_path, figures):
    from layerscope.analyses.compositionality import Compositionality

    Compositionality().plots(_comp_results(), tmp_path)
    ax = figures[1].axes[0]  # win rate by layer
    cls = next(line for line in ax.get_lines() if line.get_label() == "cls")
    xs, ys = cls.get_xdata(), cls.get_ydata()
    assert np.all(np.isnan(np.asarray(ys)[np.isin(xs, [0, 1])])), "all-tie layers must not be drawn at 0"
    assert [c.get_gid() for c in ax.collections if (c.get_gid() or "").startswith("ci:")] == ["ci:mean", "ci:cls"]
    band = next(c for c in ax.collections if c.get_gid() == "ci:mean").get_paths()[0].vertices
    assert np.isclose(band[np.isclose(band[:, 0], 3)][:, 1].max(), 0.8)  # layer 2: win rate 0.7 + 0.1


def test_sparse_layers_are_not_joined_across_the_layers_between(tmp_path, figures):
    from layerscope.report.plots import layer_lines

    layer_lines(tmp_path / "p.png", {"s": (["0", "6"], [0.1, 0.5])}, title="t", ylabel="y")
    ax = figures[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(k) for k in range(7)]
    line = ax.get_lines()[0]
    assert np.isnan(np.asarray(line.get_ydata(), dtype=float)).any(), "0 and 6 must not be joined by a line"


def test_baselines_are_horizontal_references_on_an_axis_from_zero(tmp_path, figures):
    from layerscope.report.plots import layer_lines

    layer_lines(tmp_path / "p.png", {"decoded": (["0", "1", "2"], [0.2, 0.3, 0.25])}, title="t", ylabel="AOPC",
                bands={"decoded": ([0.15, 0.25, 0.2], [0.25, 0.35, 0.3])}, refs={"random (no layer)": 0.12},
                from_zero=True)
    ax = figures[0].axes[0]
    assert ax.get_ylim()[0] <= 0.0
    ref = [line for line in ax.get_lines() if line.get_gid() == "ref:random (no layer)"]
    assert len(ref) == 1 and set(ref[0].get_ydata()) == {0.12}
    assert "random (no layer)" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_long_legend_goes_under_the_axes_not_half_the_figure(tmp_path, figures):
    from layerscope.report.plots import layer_lines

    long = {"sentence-transformers/all-MiniLM-L6-v2 top-1 = last layer's top-1": (["0", "1"], [0.5, 1.0]),
            "sentence-transformers/all-MiniLM-L6-v2 top-1 = target (next token)": (["0", "1"], [0.1, 0.2])}
    layer_lines(tmp_path / "p.png", long, title="t", ylabel="y")
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    axes = fig.axes[0].get_window_extent(renderer)
    legend = fig.axes[0].get_legend().get_window_extent(renderer)
    assert axes.width > 0.7 * fig.bbox.width
    assert legend.y1 <= axes.y0


def test_alignment_accuracy_plot_has_the_chance_line(tmp_path, figures):
    from layerscope.analyses.alignment import Alignment

    rows = [{"pooling": "mean", "layer": str(i), "z": 3.0 + i, "z_ci_low": 2.0 + i, "z_ci_high": 4.0 + i,
             "acc@1_src2tgt": 0.2 * i, "acc@1_src2tgt_ci_low": 0.1 * i, "acc@1_src2tgt_ci_high": 0.3 * i,
             "pc0_abs_d": 1.0} for i in range(3)]
    results = {"per_model": {"m": {"poolings": ["mean"], "summary": {"n_pairs": 40},
                                   "tables": {"alignment_layers": rows}}}}
    Alignment().plots(results, tmp_path)
    acc = figures[1].axes[0]
    chance = [line for line in acc.get_lines() if "chance" in line.get_label()]
    assert chance and set(chance[0].get_ydata()) == {1 / 40}
    assert any(c.get_gid() == "ci:mean" for c in acc.collections)


def test_report_html_summary_is_a_table_of_headline_figures_with_intervals():
    pytest.importorskip("plotly")
    from layerscope.report.html_page import build_page

    from layerscope.analyses.compositionality import Compositionality

    page = build_page(_comp_results(), Compositionality.metadata.figures)  # its charts: its declaration
    summary = page[page.index("id='summary'"):page.index("id='figures'")]
    assert "<th class=''>value</th>" in summary or ">value</th>" in summary
    assert "[0.600, 0.800]" in summary and "best win rate" in summary
    assert "best.win_rate" not in summary and "best.pooling" not in summary
    data = json.loads(page[page.index("id='ls-data'>") + len("id='ls-data'>"):].split("</script>")[0])
    names = [t.get("name", "") for f in data["figures"] for t in f["data"]]
    assert any("95% Wilson interval" in n for n in names), "the win rate's interval bands are drawn on the page"
    assert any("95% bootstrap interval" in n for n in names), "the mean diff's interval bands are drawn on the page"
    assert not any("bootstrap CI" in n for n in names)


def test_bench_plot_marks_rows_below_the_accuracy_class(tmp_path, figures):
    from layerscope.bench.report import bar_plot

    bench = {"model": {"source": "m"}, "corpus": {"texts": 10}, "settings": {"layers": ["0", "1"], "pooling": "mean"},
             "results": [{"available": True, "engine": e, "texts_per_s": s, "kind": k, "min_cos": c}
                         for e, s, k, c in (("hf-eager", 100.0, "baseline", 1.0), ("ort", 250.0, "engine", 0.99999),
                                            ("ort-int8", 400.0, "engine", 0.97))]}
    bar_plot(bench, tmp_path / "bench.png")
    ax = figures[0].axes[0]
    marked = [p for p in ax.patches if p.get_gid() == "below-accuracy"]
    assert len(marked) == 1 and marked[0].get_height() == 400.0
    assert any("min cos" in t.get_text() for t in ax.get_legend().get_texts())


def test_category_bars_have_whiskers_from_the_group_intervals(tmp_path, figures):
    from layerscope.analyses.compositionality import Compositionality

    results = _comp_results()
    results["per_model"]["m"]["tables"]["groups"] = [
        {"pooling": "mean", "layer": "2", "group": "category", "value": v, "win_rate": w, "win_rate_ci_low": w - 0.2,
         "win_rate_ci_high": w + 0.1} for v, w in (("modifier", 0.5), ("preposition", 0.7))]
    Compositionality().plots(results, tmp_path)
    ax = figures[2].axes[0]
    whiskers = [c for c in ax.collections if (c.get_gid() or "").startswith("ci:")]
    assert len(whiskers) == 2
    ends = sorted(tuple(sorted(seg[:, 1])) for c in whiskers for seg in c.get_segments())
    assert ends == [pytest.approx((0.3, 0.6)), pytest.approx((0.5, 0.8))]


def test_similarity_report_prose_rounds_its_figures():
    from layerscope.analyses.similarity import Similarity

    fig = {"summary": {"mean_adjacent_cka": 0.912345678901, "first_last_cka": 0.41234567, "n": 15},
           "linear_cka": [[1.0]], "layers": ["0"]}
    text = Similarity().report({"combined": {}, "per_model": {"m": fig}})
    assert "0.912" in text and "0.912345678901" not in text and "0.412" in text


def test_alignment_z_interval_brackets_a_large_z():
    """A strongly aligned set (z ~ 140): resampling pairs must not pull z down (a pair drawn twice is not its
    own scrambled partner); the interval holds the exact z and is the hand bootstrap of the per-pair terms."""
    from layerscope.analyses.alignment import with_intervals
    from layerscope.index.alignment import alignment_figures

    rng = np.random.default_rng(0)
    s = rng.standard_normal((200, 64)).astype(np.float32)
    t = s + rng.standard_normal((200, 64)).astype(np.float32)
    f = alignment_figures(s, t, n_perm=50, index_kind="flat", device="cpu")
    row = with_intervals({"z": f["z"]["z"], "acc@1_src2tgt": 1.0, "acc@5_src2tgt": 1.0, "acc@10_src2tgt": 1.0,
                          "mrr_src2tgt": 1.0, "acc@1_tgt2src": 1.0, "acc@5_tgt2src": 1.0, "acc@10_tgt2src": 1.0,
                          "mrr_tgt2src": 1.0}, f, s, t, seed=0)
    z = f["z"]["z"]
    assert z > 50 and row["z_ci_low"] < z < row["z_ci_high"]
    su = s / np.linalg.norm(s, axis=1, keepdims=True)
    tu = t / np.linalg.norm(t, axis=1, keepdims=True)
    G = su.astype(np.float64) @ tu.astype(np.float64).T  # by hand: the doubly centred diagonal of the cosines
    d = np.diag(G) - G.mean(axis=1) - G.mean(axis=0) + G.mean()
    terms = (d + G.mean() - f["z"]["scrambled_mean"]) / f["z"]["scrambled_std"]
    assert terms.mean() == pytest.approx(z, rel=1e-5)
    want = _hand_bootstrap(lambda idx: terms[idx].mean(), 200, 1000, 0)
    assert (row["z_ci_low"], row["z_ci_high"]) == pytest.approx(want, rel=1e-5)
