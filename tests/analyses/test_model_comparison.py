"""Several models in one run: the side-by-side table and the paired model-vs-model tests (issue 12)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import spearmanr

from layerscope.analyses.base import RunRequest, rerender, run_analysis
from layerscope.analyses.base import ModelOutput, PerModel
from layerscope.analyses.compare import ScoreRow, compare_models, model_rows
from layerscope.metrics.paired import correlation_scorer


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))


def _pairs_file(tmp_path, n=40, seed=5):
    rng = np.random.default_rng(seed)
    words = "the a cat dog man woman plays runs sits reads on in park house guitar book food river big old".split()
    lines = []
    for i in range(n):
        a = list(rng.choice(words, size=int(rng.integers(3, 9))))
        b = list(a) if i % 2 == 0 else list(rng.choice(words, size=int(rng.integers(3, 9))))
        if i % 2 == 0:
            b[int(rng.integers(len(b)))] = "river"
        score = round(float(rng.integers(0, 26)) * 0.2, 1)
        lines.append(f"g\tf\t2020\t{i:04d}\t{score}\t{' '.join(a)}\t{' '.join(b)}\n")
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(lines))
    return path


def _ctx(models, tmp_path, name, **kw):
    base = dict(models=[str(m) for m in models], engine="torch", layers="all", out=tmp_path / name, seed=0,
                options={"n_boot": 200}, cache=False, poolings=["mean", "cls"])
    base.update(kw)
    return RunRequest(**base)


def test_models_of_different_depth_line_up_by_relative_depth():
    """A 4-layer and a 6-layer model: depth k/4 takes the 6-layer model's nearest layer (1.5 -> 2, 4.5 -> 5)."""
    rng = np.random.default_rng(0)
    human = rng.uniform(0, 5, size=60)

    def rows(num_layers, noise):
        out = [ScoreRow("mean", "raw", None, None, None)]
        for layer in range(num_layers + 1):
            sims = human + rng.normal(scale=noise * (1 + layer), size=60)
            out.append(ScoreRow("mean", str(layer), float(spearmanr(sims, human)[0]), (0.0, 1.0),
                                correlation_scorer(sims, human)))
        return out

    rows_a, rows_b = rows(4, 0.5), rows(6, 2.0)
    per_model = PerModel({"A": ModelOutput({}, compare=model_rows(4, 60, rows_a)),
                          "B": ModelOutput({}, compare=model_rows(6, 60, rows_b))})
    out = compare_models(per_model, score="spearman", score_label="Spearman", n_resamples=100)
    side = out["tables"]["side_by_side"]
    assert out["comparison"]["by"] == "relative depth"
    assert [(r["relative depth"], r["A layer"], r["B layer"]) for r in side] == [
        ("raw", "raw", "raw"), ("0.00", "0", "0"), ("0.25", "1", "2"), ("0.50", "2", "3"), ("0.75", "3", "5"),
        ("1.00", "4", "6")]
    pairs = out["tables"]["model_comparison"]
    best = pairs[0]
    assert best["comparison"] == "best of each"
    best_a = max(rows_a[1:], key=lambda r: r.value)
    best_b = max(rows_b[1:], key=lambda r: r.value)
    assert (best["layer_a"], best["layer_b"]) == (best_a.layer, best_b.layer)
    assert best["difference"] == pytest.approx(best_a.value - best_b.value)
    matched = {r["comparison"]: r for r in pairs[1:]}
    assert set(matched) == {"depth 0.00", "depth 0.25", "depth 0.50", "depth 0.75", "depth 1.00"}  # raw: undefined
    assert (matched["depth 0.75"]["layer_a"], matched["depth 0.75"]["layer_b"]) == ("3", "5")
    for r in pairs:
        assert r["ci_low"] <= r["difference"] <= r["ci_high"] and 0 <= r["p_value"] <= 1
        assert (r["ci_low"] > 0 or r["ci_high"] < 0) == (r["p_value"] < 0.05)
    # Holm over the 6 tests of the run, by hand: sort, multiply by m - rank, running maximum, cap at 1
    ps = [r["p_value"] for r in pairs]
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    running, expected = 0.0, [0.0] * len(ps)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        expected[i] = running
    assert [r["p_holm"] for r in pairs] == pytest.approx(expected)
    assert out["comparison"]["correction"] == "Holm over the 6 tests of this run"


def _const_rows(values, group="mean"):
    """Rows whose per-item score is the given constant (a scorer returning it for any resample)."""
    out = []
    for layer, v in values:
        scorer = None if v is None else (lambda idx, v=v: np.full(np.asarray(idx).shape[:-1], v, dtype=float))
        out.append(ScoreRow(group, layer, v, None, scorer))
    return out


def test_best_is_a_defined_layer_never_the_raw_embeddings_and_ties_are_named():
    from layerscope.report.compare import comparison_markdown, comparison_rows

    a = _const_rows([("raw", 0.9), ("0", float("nan")), ("1", 0.5), ("2", 0.7), ("3", 0.7)])
    b = _const_rows([("raw", 0.4), ("0", 0.0), ("1", 0.0), ("2", 0.0), ("3", 0.0)])
    per_model = PerModel({"A": ModelOutput({}, compare=model_rows(3, 10, a)),
                          "B": ModelOutput({}, compare=model_rows(3, 10, b))})
    out = compare_models(per_model, score="spearman", score_label="Spearman", n_resamples=20)
    best = out["tables"]["model_comparison"][0]
    assert best["comparison"] == "best of each"
    assert (best["layer_a"], best["tied_a"]) == ("2", "3")  # raw's 0.9 and layer 0's NaN are not candidates
    assert (best["layer_b"], best["tied_b"]) == ("0", "1, 2, 3")
    assert out["tables"]["model_comparison"][1]["comparison"] != "best of each"
    notes = out["comparison"]["notes"]
    assert any(n.startswith("A: 2 layers tie for best at 0.7000 (mean 2, mean 3)") for n in notes)
    assert any("B: 4 layers tie for best (every layer) at 0.0000" in n for n in notes)
    header, cells = comparison_rows({"combined": out})
    assert header[-2:] == ["p", "p (Holm)"]
    assert cells[0][1] == "A mean 2 (tied with 3)" and cells[0][2] == "B mean 0 (tied with 1, 2, 3)"
    md = comparison_markdown({"combined": out})
    assert "Holm" in md and "4 layers tie for best (every layer)" in md


def test_one_model_gets_no_comparison():
    per_model = PerModel({"A": ModelOutput({}, compare=model_rows(2, 10, [ScoreRow("mean", "1", 0.5, None, None)]))})
    assert compare_models(per_model, score="spearman", score_label="Spearman") == {}


def test_two_model_sts_run_writes_side_by_side_and_paired_tests(tiny_model, tmp_path):
    data = _pairs_file(tmp_path)
    models = [tiny_model("bert"), tiny_model("roberta")]
    out, res = run_analysis("sts", _ctx(models, tmp_path, "two", data=str(data)))
    names = list(res["per_model"])
    meta = res["combined"]["comparison"]
    assert meta["models"] == names and meta["by"] == "layer" and meta["n_items"] == 40
    tables = res["combined"]["tables"]
    side = tables["side_by_side"]
    assert [(r["pooling"], r["layer"]) for r in side] == [(p, x) for p in ("mean", "cls")
                                                           for x in ("raw", "0", "1", "2")]
    by_model = {n: {(r["pooling"], r["layer"]): r for r in res["per_model"][n]["tables"]["layers"]} for n in names}
    for r in side:  # each model's column is that model's own figure with its own interval
        for n in names:
            own = by_model[n][r["pooling"], r["layer"]]
            assert r[f"{n} spearman"] == own["spearman"] and r[f"{n} ci_low"] == own["spearman_ci_low"]
    pairs = tables["model_comparison"]
    same = [p for p in pairs if p["comparison"] == "same layer"]
    defined = [k for k, r in by_model[names[0]].items() if r["spearman"] is not None]
    assert len(same) == len(defined) >= 4
    for p in same:  # the difference of the two models' own figures on the same rows
        a = by_model[names[0]][p["pooling_a"], p["layer_a"]]["spearman"]
        b = by_model[names[1]][p["pooling_b"], p["layer_b"]]["spearman"]
        assert (p["pooling_a"], p["layer_a"]) == (p["pooling_b"], p["layer_b"])
        assert p["spearman_a"] == pytest.approx(a) and p["spearman_b"] == pytest.approx(b)
        assert p["difference"] == pytest.approx(a - b)
        assert p["ci_low"] <= p["difference"] <= p["ci_high"]
    files = {f.name for f in out.iterdir()}
    assert {"side_by_side.csv", "model_comparison.csv"} <= files
    report = (out / "report.md").read_text()
    assert "## Models side by side" in report and "## Model vs model (paired bootstrap)" in report
    saved = json.loads((out / "results.json").read_text())
    assert saved["combined"]["tables"]["model_comparison"] == pairs
    (out / "report.md").unlink()
    rerender(out)  # from results.json alone
    assert (out / "report.md").read_text() == report


def test_same_model_twice_differs_by_exactly_zero(tiny_model, tmp_path):
    """Both copies are scored on the same resampled pairs, so every resample's difference is 0 (an unpaired
    bootstrap would give a wide interval around 0)."""
    data = _pairs_file(tmp_path)
    model = tiny_model("bert")
    _, res = run_analysis("sts", _ctx([model, model], tmp_path, "twice", data=str(data), poolings=["mean"]))
    pairs = res["combined"]["tables"]["model_comparison"]
    assert len(pairs) == 1 + 4
    for p in pairs:
        assert p["difference"] == 0.0 and p["ci_low"] == 0.0 and p["ci_high"] == 0.0 and p["p_value"] == 1.0


def test_compositionality_pooling_and_alignment_compare_their_main_scores(tiny_model, tmp_path):
    pytest.importorskip("faiss")
    models = [tiny_model("bert"), tiny_model("roberta")]
    _, comp = run_analysis("compositionality", _ctx(models, tmp_path, "comp", poolings=["mean"]))
    names = list(comp["per_model"])
    side = comp["combined"]["tables"]["side_by_side"]
    for r in side:  # win rate with a bootstrap interval made from the per-item differences
        own = next(x for x in comp["per_model"][names[0]]["tables"]["layers"]
                   if (x["pooling"], x["layer"]) == (r["pooling"], r["layer"]))
        assert r[f"{names[0]} win_rate"] == own["win_rate"]
        assert r[f"{names[0]} ci_low"] <= own["win_rate"] <= r[f"{names[0]} ci_high"]
    assert comp["combined"]["comparison"]["score"] == "win_rate"

    data = _pairs_file(tmp_path)
    _, pool = run_analysis("pooling", _ctx(models, tmp_path, "pool", data=str(data), poolings=["mean", "cls"]))
    side = pool["combined"]["tables"]["side_by_side"]
    assert [(r["pooling"], r["layer"]) for r in side] == [("mean", "final"), ("cls", "final"), ("mean", "last4"),
                                                         ("mean", "second-to-last")]

    _, al = run_analysis("alignment", _ctx(models, tmp_path, "al", poolings=["mean"], seed=3,
                                           options={"generate": "zh-en", "n": 30, "permutations": 64, "knn": 5}))
    names = list(al["per_model"])
    pairs = al["combined"]["tables"]["model_comparison"]
    assert pairs and al["combined"]["data"]["n"] == 30 and "pairs" in al["combined"]["tables"]
    for p in pairs:  # the resampled statistic on all pairs is the analysis's own exact z
        a = next(r for r in al["per_model"][names[0]]["tables"]["alignment_layers"]
                 if (r["pooling"], r["layer"]) == (p["pooling_a"], p["layer_a"]))
        assert p["z_exact_a"] == pytest.approx(a["z_exact"], rel=1e-5)  # float64 Gram vs float32 vectors


def test_mteb_two_models_resample_the_local_sts_pairs(tiny_model, tmp_path, capsys):
    """The resampled statistic on all pairs reproduces MTEB's own main score for each model and layer."""
    pytest.importorskip("mteb")
    pytest.importorskip("datasets")
    from cli_helpers import run_cli

    import csv

    data = _pairs_file(tmp_path)
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "score"])
        for line in data.read_text().splitlines():
            f = line.split("\t")
            w.writerow([f[5], f[6], f[4]])
    out = tmp_path / "mteb"
    code, text = run_cli(["run", "mteb", "--model", str(tiny_model("bert")), "--model", str(tiny_model("roberta")),
                          "--engine", "torch", "--tasks", "STSBenchmark", "--data", str(pairs), "--pooling", "mean",
                          "--out", str(out)], capsys)
    assert code == 0, text
    flat = " ".join(text.split())  # rich wraps long titles
    assert "models side by side" in flat and "paired bootstrap over 40 items" in flat  # printed, not only written
    res = json.loads((out / "results.json").read_text())
    names = list(res["per_model"])
    comp = res["combined"]["tables"]["model_comparison"]
    assert len(comp) == 1 + 4  # best of each, then raw, 0, 1, 2
    for p in comp:
        for side, name in (("a", names[0]), ("b", names[1])):
            own = next(r for r in res["per_model"][name]["tables"]["layers"] if r["layer"] == p[f"layer_{side}"])
            assert p[f"main_score_{side}"] == pytest.approx(own["main_score"], abs=1e-5)
