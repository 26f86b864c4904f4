"""The alignment z, its interval and its Monte Carlo check, against enumeration and hand computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from layerscope.metrics import permutation

pytest.importorskip("faiss")


def _z_by_enumeration(S, T):
    """(matched, mean, std, z) of the mean cosine over all n! pairings of unit-normalised rows (population std)."""
    S = S / np.linalg.norm(S, axis=1, keepdims=True)
    T = T / np.linalg.norm(T, axis=1, keepdims=True)
    G = S.astype(np.float64) @ T.astype(np.float64).T
    n = len(S)
    vals = np.array([G[np.arange(n), list(p)].mean() for p in itertools.permutations(range(n))])
    matched = float(np.trace(G) / n)
    return matched, vals.mean(), vals.std(), (matched - vals.mean()) / vals.std()


def _pairs(n=6, d=16, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((n, d)).astype(np.float32)
    t = (s + 1.5 * rng.standard_normal((n, d))).astype(np.float32) + 0.3
    return s, t


def test_headline_and_pc_z_are_the_exact_permutation_values():
    from layerscope.index.alignment import alignment_figures, category_figures
    from layerscope.index.vector_index import normalize

    s, t = _pairs()
    f = alignment_figures(s, t, index_kind="flat", device="cpu", knn_k=2)
    S, T = normalize(s), normalize(t)
    matched, mean, std, z = _z_by_enumeration(S, T)
    assert f["z"]["method"] == "exact" and "z_monte_carlo" not in f
    assert (f["z"]["matched"], f["z"]["scrambled_mean"], f["z"]["scrambled_std"], f["z"]["z"]) == pytest.approx(
        (matched, mean, std, z), rel=1e-6)
    assert category_figures(s, t, seed=0)["z"] == pytest.approx(z, rel=1e-6)
    # within the first k principal components of both sides stacked (centred; a component's sign changes no
    # cosine), by numpy's SVD
    X = np.concatenate([S, T]).astype(np.float64)
    X -= X.mean(axis=0)
    proj = X @ np.linalg.svd(X, full_matrices=False)[2].T
    for k in (2, 5, 10):
        assert f["pca"]["z_within"][str(k)] == pytest.approx(_z_by_enumeration(proj[:6, :k], proj[6:, :k])[3],
                                                             rel=1e-6), k


def test_monte_carlo_check_reports_its_standard_error():
    from scipy.stats import kurtosis, skew

    from layerscope.index.alignment import alignment_figures

    # the delta-method formula, with SciPy's skewness and kurtosis of the sampled scrambled means
    vals = np.random.default_rng(1).gamma(2.0, size=500)
    z = 3.5
    want = math.sqrt((1 + z * skew(vals) + z * z * (kurtosis(vals, fisher=False) - 1) / 4) / 500)
    assert permutation.monte_carlo_z_se(z, vals) == pytest.approx(want, rel=1e-12)
    # normal scrambled means: sqrt((1 + z^2 / 2) / B)
    normal = np.random.default_rng(2).standard_normal(200_000)
    assert permutation.monte_carlo_z_se(28.0, normal) == pytest.approx(math.sqrt((1 + 28.0 ** 2 / 2) / 200_000),
                                                                      rel=0.02)
    # it is the run-to-run spread of the Monte Carlo z over seeds
    rng = np.random.default_rng(3)
    s = rng.standard_normal((40, 8))
    t = s + 0.8 * rng.standard_normal((40, 8))
    runs = [permutation.scrambled_z(s, t, n_perm=200, seed=k) for k in range(300)]
    spread = np.std([r["z"] for r in runs], ddof=1)
    assert np.median([r["z_se"] for r in runs]) == pytest.approx(spread, rel=0.2)
    f = alignment_figures(s.astype(np.float32), t.astype(np.float32), n_perm=200, index_kind="flat", device="cpu",
                          knn_k=2)
    mc = f["z_monte_carlo"]
    assert mc["z_se"] > 0 and abs(mc["z"] - f["z"]["z"]) < 5 * mc["z_se"]


def test_z_interval_is_about_the_exact_z_and_the_effect_beside_it():
    """The z interval bootstraps per-pair terms whose mean is the exact z; the effect's interval is the same
    resamples in cosine units; both are hand bootstraps of the terms written out here."""
    from layerscope.analyses.alignment import with_intervals
    from layerscope.index.alignment import alignment_figures
    from layerscope.index.vector_index import normalize

    rng = np.random.default_rng(4)
    s = rng.standard_normal((60, 12)).astype(np.float32)
    t = (s + 2.0 * rng.standard_normal((60, 12))).astype(np.float32)
    f = alignment_figures(s, t, n_perm=100, index_kind="flat", device="cpu", knn_k=3)
    row = with_intervals({"z": f["z"]["z"], "effect": f["z"]["matched"] - f["z"]["scrambled_mean"],
                          **{f"{m}_{d}": 0.5 for m in ("acc@1", "acc@5", "acc@10", "mrr") for d in ("src2tgt",
                                                                                                 "tgt2src")}},
                         f, s, t, seed=2)
    S, T = normalize(s).astype(np.float64), normalize(t).astype(np.float64)
    G = S @ T.T
    effect_terms = np.diag(G) - G.mean(axis=1) - G.mean(axis=0) + G.mean()  # mean: matched - scrambled mean
    exact_std = _hoeffding_std(G)
    assert effect_terms.mean() / exact_std == pytest.approx(f["z"]["z"], rel=1e-6)
    rs = np.random.default_rng(2).integers(0, 60, (1000, 60))
    boot = np.array([effect_terms[i].mean() for i in rs])
    lo, hi = np.quantile(boot, [0.025, 0.975])
    assert (row["effect_ci_low"], row["effect_ci_high"]) == pytest.approx((lo, hi), rel=1e-9)
    assert (row["z_ci_low"], row["z_ci_high"]) == pytest.approx((lo / exact_std, hi / exact_std), rel=1e-9)
    assert row["z_ci_low"] < f["z"]["z"] < row["z_ci_high"]
    assert row["z_ci_method"] == row["effect_ci_method"] == "bootstrap-percentile-pair-terms"
    assert row["mrr_src2tgt_ci_method"] == "bootstrap-percentile" and row["acc@1_src2tgt_ci_method"] == "wilson"


def _hoeffding_std(G):
    n = len(G)
    D = G - G.mean(axis=1, keepdims=True) - G.mean(axis=0, keepdims=True) + G.mean()
    return math.sqrt((D ** 2).sum() / (n * n * (n - 1)))


def test_acc_at_k_gets_a_wilson_interval_valid_at_zero():
    """Retrieval that never finds the partner first: acc@1 = 0/n with the interval SciPy gives, not [0, 0]."""
    from scipy.stats import binomtest

    from layerscope.analyses.alignment import with_intervals
    from layerscope.index.alignment import alignment_figures

    rng = np.random.default_rng(5)
    base = rng.standard_normal((30, 8)).astype(np.float32)
    s, t = base, np.roll(base, 1, axis=0) + 0.01 * rng.standard_normal((30, 8)).astype(np.float32)
    f = alignment_figures(s, t, index_kind="flat", device="cpu", knn_k=2)
    row = {"z": f["z"]["z"], **{f"{m}_{d}": f["retrieval"][d][m] for m in ("acc@1", "acc@5", "acc@10", "mrr")
                                for d in ("src2tgt", "tgt2src")}}
    assert row["acc@1_src2tgt"] == 0.0
    with_intervals(row, f, s, t, seed=0)
    want = binomtest(0, 30).proportion_ci(method="wilson")
    assert (row["acc@1_src2tgt_ci_low"], row["acc@1_src2tgt_ci_high"]) == pytest.approx((want.low, want.high))
    assert row["acc@1_src2tgt_ci_high"] > 0.1
