"""Tests for the layerscope.metrics modules against hand-computed values.

Each expected number is worked out in the comment next to it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from layerscope.metrics import cka, comparison, correlation, neighbors, pca, permutation, quantization, vectors


# ---------------------------------------------------------------- vectors


def test_l2_normalize_rows_and_zero_row():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [0.0, -2.0]])
    # [3,4] / 5 = [0.6, 0.8]; zero row stays zero; [0,-2]/2 = [0,-1]
    out = vectors.l2_normalize(x)
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0], [0.0, -1.0]])
    assert out.dtype == np.float64


def test_l2_normalize_keeps_float32_and_handles_1d_and_ints():
    x = np.array([[1.0, 1.0]], dtype=np.float32)
    out = vectors.l2_normalize(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[1 / math.sqrt(2)] * 2], rtol=1e-6)
    # 1-D int vector [0, 5] -> [0, 1] as float64
    v = vectors.l2_normalize(np.array([0, 5]))
    assert v.dtype == np.float64
    np.testing.assert_array_equal(v, [0.0, 1.0])
    with pytest.raises(ValueError):
        vectors.l2_normalize(np.zeros((2, 2, 2)))


def test_paired_cosine_hand_values():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [2.0, 0.0]])
    b = np.array([[0.0, 3.0], [2.0, 2.0], [1.0, 1.0], [-1.0, 0.0]])
    # row0 orthogonal -> 0; row1 parallel -> 1; row2 zero vector -> 0; row3 opposite -> -1
    np.testing.assert_allclose(vectors.paired_cosine(a, b), [0.0, 1.0, 0.0, -1.0], atol=1e-15)
    # [1,2]·[3,1] = 5, |.|=sqrt5*sqrt10 -> 5/sqrt(50) = 0.70710678
    c = vectors.paired_cosine(np.array([[1.0, 2.0]], dtype=np.float32), np.array([[3.0, 1.0]], dtype=np.float32))
    assert c.dtype == np.float64
    assert c[0] == pytest.approx(5 / math.sqrt(50), abs=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        vectors.paired_cosine(a, b[:3])


# ---------------------------------------------------------------- correlations


def test_pearson_hand_value_and_p():
    x = [1, 2, 3, 4]
    y = [1, 3, 2, 4]
    # centred x = [-1.5,-.5,.5,1.5], centred y = [-1.5,.5,-.5,1.5]
    # sum xy = 2.25 - .25 - .25 + 2.25 = 4; sum x^2 = sum y^2 = 5 -> r = 4/5 = 0.8
    # df = n-2 = 2: t^2 = 2 r^2/(1-r^2), two-sided p = 1 - t/sqrt(2+t^2) = 1 - |r| = 0.2
    c = correlation.pearson(x, y, n_boot=0)
    assert c.value == pytest.approx(0.8, abs=1e-12)
    assert c.p_value == pytest.approx(0.2, abs=1e-9)
    assert c.n == 4 and c.undefined is None
    assert c.ci_low is None and c.ci_high is None  # no bootstrap asked


def test_pearson_and_spearman_differ_on_hand_example():
    x = [1, 2, 3, 10]
    y = [2, 1, 4, 3]
    # Pearson: mean x = 4 -> xc = [-3,-2,-1,6]; mean y = 2.5 -> yc = [-.5,-1.5,1.5,.5]
    # sum xy = 1.5 + 3 - 1.5 + 3 = 6; sum x^2 = 50; sum y^2 = 5 -> r = 6/sqrt(250) = 0.3794733
    assert correlation.pearson(x, y, n_boot=0).value == pytest.approx(6 / math.sqrt(250), abs=1e-12)
    # Spearman: ranks x = [1,2,3,4], ranks y = [2,1,4,3]; d = [-1,1,-1,1], sum d^2 = 4
    # rho = 1 - 6*4/(4*(16-1)) = 1 - 24/60 = 0.6; p (df=2) = 1 - 0.6 = 0.4
    s = correlation.spearman(x, y, n_boot=0)
    assert s.value == pytest.approx(0.6, abs=1e-12)
    assert s.p_value == pytest.approx(0.4, abs=1e-9)


def test_spearman_ties_use_average_ranks():
    x = [1, 1, 2, 3]
    y = [1, 2, 3, 4]
    # ranks x = [1.5, 1.5, 3, 4] (mean 2.5): centred [-1,-1,.5,1.5], sum sq = 1+1+.25+2.25 = 4.5
    # ranks y = [1,2,3,4]: centred [-1.5,-.5,.5,1.5], sum sq = 5
    # sum prod = 1.5 + .5 + .25 + 2.25 = 4.5 -> rho = 4.5/sqrt(4.5*5) = sqrt(0.9) = 0.9486833
    assert correlation.spearman(x, y, n_boot=0).value == pytest.approx(math.sqrt(0.9), abs=1e-12)


@pytest.mark.parametrize("fn", [correlation.pearson, correlation.spearman])
def test_correlation_undefined_on_constant_input(fn):
    c = fn([0.5, 0.5, 0.5, 0.5], [1, 2, 3, 4], x_name="the similarities")
    assert c.value is None and c.p_value is None and c.ci_low is None
    assert c.n == 4
    assert "constant" in c.undefined and "the similarities" in c.undefined
    assert "0.5" in c.undefined
    d = c.to_dict()
    assert d["value"] is None and d["undefined"] == c.undefined
    # constant y is named too
    c2 = fn([1, 2, 3], [7, 7, 7])
    assert c2.value is None and "(y)" in c2.undefined


@pytest.mark.parametrize("fn", [correlation.pearson, correlation.spearman])
def test_correlation_input_errors(fn):
    with pytest.raises(ValueError, match="at least 3"):
        fn([1, 2], [2, 1])
    with pytest.raises(ValueError, match="2 NaN values"):
        fn([1, np.nan, 3, np.nan], [1, 2, 3, 4])
    with pytest.raises(ValueError, match="1 infinite value"):
        fn([1, 2, 3, 4], [1, 2, np.inf, 4])
    with pytest.raises(ValueError, match="same length"):
        fn([1, 2, 3, 4], [1, 2, 3])
    with pytest.raises(ValueError, match="ci"):
        fn([1, 2, 3, 4], [1, 3, 2, 4], ci=1.0)


@pytest.mark.parametrize("fn", [correlation.pearson, correlation.spearman])
def test_bootstrap_ci_contains_value_and_is_reproducible(fn):
    rng = np.random.default_rng(42)
    x = rng.normal(size=200)
    y = 0.6 * x + 0.8 * rng.normal(size=200)
    a = fn(x, y, n_boot=500, seed=7)
    b = fn(x, y, n_boot=500, seed=7)
    c = fn(x, y, n_boot=500, seed=8)
    assert a.ci_low < a.value < a.ci_high
    assert -1 <= a.ci_low and a.ci_high <= 1
    assert (a.ci_low, a.ci_high) == (b.ci_low, b.ci_high)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)
    # a narrower level gives a narrower interval
    n90 = fn(x, y, n_boot=500, seed=7, ci=0.5)
    assert a.ci_low < n90.ci_low < n90.ci_high < a.ci_high


def test_bootstrap_percentiles_match_a_manual_resampling():
    # Re-derive the interval by hand with the documented recipe: one block of
    # rng.integers(0, n, (n_boot, n)), skip constant resamples, percentiles.
    x = np.array([0.1, 0.4, 0.35, 0.8, 0.7, 0.2])
    y = np.array([1.0, 2.0, 2.5, 4.0, 3.0, 1.5])
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 6, size=(200, 6))
    vals = []
    for row in idx:
        xs, ys = x[row], y[row]
        if np.ptp(xs) == 0 or np.ptp(ys) == 0:
            continue
        vals.append(np.corrcoef(xs, ys)[0, 1])
    lo, hi = np.quantile(vals, [0.025, 0.975])
    c = correlation.pearson(x, y, n_boot=200, seed=3)
    assert c.ci_low == pytest.approx(lo, abs=1e-12)
    assert c.ci_high == pytest.approx(hi, abs=1e-12)


def test_bootstrap_skips_constant_resamples():
    # n = 3 with a binary x: a resample is constant whenever it misses index 2
    # or draws only index 2 -> (8 + 1)/27 of resamples are skipped; rest are finite.
    # Skipped, not computed: a 0/0 correlation would raise here as a RuntimeWarning.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = correlation.pearson([0, 0, 1], [0, 1, 3], n_boot=300, seed=0)
        correlation.spearman([0, 1, 3], [0, 0, 1], n_boot=300, seed=0)
    assert c.ci_low is not None and math.isfinite(c.ci_low) and math.isfinite(c.ci_high)
    assert -1 <= c.ci_low <= c.ci_high <= 1


# ---------------------------------------------------------------- paired


def test_sign_test_hand_values():
    # 8 wins of 10: P(X <= 2) = (1 + 10 + 45)/1024 = 56/1024; two-sided = 112/1024 = 0.109375
    assert comparison.sign_test(8, 2) == pytest.approx(0.109375, abs=1e-12)
    assert comparison.sign_test(2, 8) == pytest.approx(0.109375, abs=1e-12)
    # 10 of 10: 2 * (1/1024) = 0.001953125
    assert comparison.sign_test(10, 0) == pytest.approx(0.001953125, abs=1e-15)
    assert comparison.sign_test(5, 5) == pytest.approx(1.0)
    assert comparison.sign_test(0, 0) == 1.0
    with pytest.raises(ValueError):
        comparison.sign_test(-1, 3)


def test_compositionality_summary_hand_example():
    para = [np.array([0.9, 0.7]), np.array([0.5]), np.array([0.6, 0.6, 0.9])]
    neg = np.array([0.6, 0.5, 0.8])
    # item means 0.8, 0.5, 0.7 -> diffs 0.2, 0.0, -0.1
    # mean = 0.1/3 = 0.033333; deviations .166667, -.033333, -.133333
    # squares .0277778 + .0011111 + .0177778 = .0466667; /2 = .0233333 -> std = .1527525
    s = comparison.compositionality_summary(para, neg)
    assert s["n_items"] == 3
    assert s["mean_diff"] == pytest.approx(0.1 / 3, abs=1e-12)
    assert s["std"] == pytest.approx(math.sqrt(0.07 / 3), abs=1e-12)
    assert (s["wins"], s["losses"], s["ties"]) == (1, 1, 1)
    assert s["win_rate"] == pytest.approx(1 / 3)
    assert s["sign_p"] == pytest.approx(1.0)  # 1 win vs 1 loss
    np.testing.assert_allclose(s["per_item_diffs"], [0.2, 0.0, -0.1], atol=1e-12)
    assert s["mean_paraphrase"] == pytest.approx(2.0 / 3)
    assert s["mean_negative"] == pytest.approx(1.9 / 3)


def test_compositionality_summary_2d_input_and_errors():
    para = np.array([[0.9, 0.7], [0.8, 0.6], [0.3, 0.5], [0.9, 0.9]])
    neg = np.array([0.5, 0.5, 0.5, 0.5])
    # means .8, .7, .4, .9 -> diffs .3, .2, -.1, .4 -> 3 wins, 1 loss; mean = .8/4 = .2
    # sign p for (3,1): P(X<=1 of 4) = 5/16, two-sided 10/16 = 0.625
    s = comparison.compositionality_summary(para, neg)
    assert s["mean_diff"] == pytest.approx(0.2)
    assert (s["wins"], s["losses"], s["ties"]) == (3, 1, 0)
    assert s["win_rate"] == 0.75
    assert s["sign_p"] == pytest.approx(0.625)
    with pytest.raises(ValueError, match="items"):
        comparison.compositionality_summary(para, neg[:3])
    with pytest.raises(ValueError, match="no values"):
        comparison.compositionality_summary([np.array([0.5]), np.array([])], np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="NaN"):
        comparison.compositionality_summary(np.array([0.5, np.nan]), np.array([0.1, 0.2]))


def test_paired_difference_single_item():
    p = comparison.paired_difference(np.array([0.25]))
    assert p.n == 1 and p.std is None and p.wins == 1 and p.win_rate == 1.0
    assert p.sign_p == pytest.approx(1.0)  # 1 of 1: two-sided p = 2 * 0.5 = 1
    assert p.to_dict()["mean_diff"] == 0.25


# ---------------------------------------------------------------- scrambled z


def _identity_case():
    # src = tgt = e1, e2, e3 (rows scaled to check the normalisation).
    src = np.eye(3) * np.array([[2.0], [0.5], [3.0]])
    tgt = np.eye(3) * np.array([[1.0], [4.0], [0.1]])
    return src, tgt


def test_scrambled_z_exhaustive_hand_example():
    src, tgt = _identity_case()
    # matched = 1. A permutation's mean cosine = (#fixed points)/3:
    # identity 3/3, three transpositions 1/3 each, two 3-cycles 0.
    # mean = (1 + 3*(1/3)) / 6 = 1/3; E[m^2] = (1 + 3/9)/6 = 2/9; var = 2/9 - 1/9 = 1/9 -> std 1/3
    # z = (1 - 1/3) / (1/3) = 2
    r = permutation.scrambled_z(src, tgt, exhaustive=True)
    assert r["matched"] == pytest.approx(1.0)
    assert r["scrambled_mean"] == pytest.approx(1 / 3)
    assert r["scrambled_std"] == pytest.approx(1 / 3)
    assert r["z"] == pytest.approx(2.0)
    assert r["n_perm"] == 6 and r["method"] == "exhaustive" and r["undefined"] is None


def test_scrambled_z_exact_matches_hand_example_and_enumeration():
    src, tgt = _identity_case()
    # exact: mean = (sum s).(sum t)/n^2 = [1,1,1].[1,1,1]/9 = 1/3;
    # centred Grams are both H = I - J/3, <H,H> = trace(H) = 2; var = 2/(9*2) = 1/9
    r = permutation.scrambled_z_exact(src, tgt)
    assert r["scrambled_mean"] == pytest.approx(1 / 3)
    assert r["scrambled_std"] == pytest.approx(1 / 3)
    assert r["z"] == pytest.approx(2.0)
    assert r["method"] == "exact" and r["n_perm"] is None
    # On random data with n = 6 the closed form equals full enumeration.
    rng = np.random.default_rng(5)
    s, t = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    ex = permutation.scrambled_z(s, t, exhaustive=True)
    cf = permutation.scrambled_z_exact(s, t)
    assert ex["n_perm"] == 720
    for key in ("matched", "scrambled_mean", "scrambled_std", "z"):
        assert ex[key] == pytest.approx(cf[key], rel=1e-10, abs=1e-12)


def test_scrambled_z_monte_carlo_agrees_with_exact():
    src, tgt = _identity_case()
    mc = permutation.scrambled_z(src, tgt, n_perm=4000, seed=1)
    assert mc["method"] == "monte-carlo" and mc["n_perm"] == 4000
    # SE of the MC mean = (1/3)/sqrt(4000) = 0.0053; allow ~4 SE
    assert mc["scrambled_mean"] == pytest.approx(1 / 3, abs=0.02)
    assert mc["scrambled_std"] == pytest.approx(1 / 3, rel=0.05)

    rng = np.random.default_rng(11)
    s = rng.normal(size=(60, 8))
    t = s + 0.7 * rng.normal(size=(60, 8)) + 0.5  # shared offset -> scrambled mean > 0
    exact = permutation.scrambled_z_exact(s, t)
    mc = permutation.scrambled_z(s, t, n_perm=3000, seed=2)
    se = exact["scrambled_std"] / math.sqrt(3000)
    assert abs(mc["scrambled_mean"] - exact["scrambled_mean"]) < 4 * se
    assert mc["scrambled_std"] == pytest.approx(exact["scrambled_std"], rel=0.06)
    assert mc["matched"] == pytest.approx(exact["matched"])
    assert mc["z"] > 5
    # reproducible with the same seed, different with another
    assert permutation.scrambled_z(s, t, n_perm=300, seed=2) == permutation.scrambled_z(s, t, n_perm=300, seed=2)
    assert permutation.scrambled_z(s, t, n_perm=300, seed=3)["scrambled_mean"] != mc["scrambled_mean"]


def test_scrambled_direct_path_equals_gram_path():
    # The large-n path (no n x n matrix) gives the same per-permutation means.
    rng = np.random.default_rng(0)
    S = vectors.l2_normalize(rng.normal(size=(37, 5)))
    T = vectors.l2_normalize(rng.normal(size=(37, 5)))
    perms = np.array([rng.permutation(37) for _ in range(9)])
    gram = permutation._scrambled_means_gram(S @ T.T, perms)
    direct = permutation._scrambled_means_direct(S, T, perms)
    np.testing.assert_allclose(direct, gram, rtol=0, atol=1e-13)
    # by hand for one permutation
    p = perms[0]
    assert gram[0] == pytest.approx(np.mean([S[i] @ T[p[i]] for i in range(37)]))


def test_scrambled_direct_path_in_small_blocks(monkeypatch):
    # Force tiny blocks so permutations and rows are both chunked.
    rng = np.random.default_rng(1)
    S = vectors.l2_normalize(rng.normal(size=(23, 4)))
    T = vectors.l2_normalize(rng.normal(size=(23, 4)))
    perms = np.array([rng.permutation(23) for _ in range(5)])
    expected = permutation._scrambled_means_gram(S @ T.T, perms)
    monkeypatch.setattr(permutation, "BLOCK_ELEMENTS", 20)  # 5 rows x 4 dims per chunk, 1 perm per block
    np.testing.assert_allclose(permutation._scrambled_means_direct(S, T, perms), expected, atol=1e-13)
    monkeypatch.setattr(permutation, "_GRAM_MAX_N", 4)  # scrambled_z takes the direct path end to end
    a = permutation.scrambled_z(S, T, n_perm=50, seed=4)
    monkeypatch.setattr(permutation, "_GRAM_MAX_N", 10_000)
    b = permutation.scrambled_z(S, T, n_perm=50, seed=4)
    assert a["scrambled_mean"] == pytest.approx(b["scrambled_mean"], abs=1e-13)
    assert a["scrambled_std"] == pytest.approx(b["scrambled_std"], abs=1e-13)


def test_scrambled_z_undefined_and_errors():
    # every src row identical -> every permutation gives the same mean -> std 0
    src = np.ones((4, 3))
    tgt = np.random.default_rng(0).normal(size=(4, 3))
    for r in (permutation.scrambled_z(src, tgt, exhaustive=True), permutation.scrambled_z_exact(src, tgt)):
        assert r["z"] is None and "std is 0" in r["undefined"]
        assert r["scrambled_std"] <= 1e-12
    with pytest.raises(ValueError, match="n <= 8"):
        permutation.scrambled_z(np.eye(9), np.eye(9), exhaustive=True)
    with pytest.raises(ValueError, match="same shape"):
        permutation.scrambled_z(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="at least 2"):
        permutation.scrambled_z(np.ones((1, 3)), np.ones((1, 3)))


# ---------------------------------------------------------------- retrieval


def test_retrieval_metrics_hand_ranks():
    r = neighbors.retrieval_metrics(np.array([1, 2, 5, 11]))
    # acc@1 = 1/4; acc@5 = 3/4 (1,2,5); acc@10 = 3/4; mrr = (1 + 1/2 + 1/5 + 1/11)/4 = 0.4477273
    assert r == pytest.approx({"acc@1": 0.25, "acc@5": 0.75, "acc@10": 0.75,
                               "mrr": (1 + 0.5 + 0.2 + 1 / 11) / 4})
    assert list(r) == ["acc@1", "acc@5", "acc@10", "mrr"]
    # a first place shared by two (rank 1 or 2, each half the time) and a clear third place; custom ks:
    # acc@1 = (1/2 + 0) / 2, acc@2 = (1 + 0) / 2, mrr = ((1 + 1/2) / 2 + 1/3) / 2
    r2 = neighbors.retrieval_metrics(neighbors.TiedRanks(np.array([0.0, 2.0]), np.array([2, 1])), ks=(1, 2))
    assert r2 == pytest.approx({"acc@1": 0.25, "acc@2": 0.5, "mrr": (0.75 + 1 / 3) / 2})
    with pytest.raises(ValueError, match="fractional rank"):
        neighbors.retrieval_metrics(np.array([1.5, 3.0]))
    with pytest.raises(ValueError, match="1-based"):
        neighbors.retrieval_metrics(np.array([0, 1]))
    with pytest.raises(ValueError):
        neighbors.retrieval_metrics(np.array([]))


def test_ranks_from_scores_ties_share_mean_rank():
    scores = np.array([[0.9, 0.5, 0.9, 0.1],
                       [0.9, 0.5, 0.9, 0.1],
                       [0.9, 0.5, 0.9, 0.1],
                       [0.2, 0.2, 0.2, 0.2]])
    correct = np.array([0, 1, 3, 2])
    # q0: item 0 ties with item 2 at the top -> 1 + 0 + 1/2 = 1.5
    # q1: two higher -> 3; q2: three higher -> 4; q3: all four tied -> 1 + 3/2 = 2.5
    np.testing.assert_array_equal(neighbors.ranks_from_scores(scores, correct), [1.5, 3.0, 4.0, 2.5])
    with pytest.raises(ValueError, match="correct indices"):
        neighbors.ranks_from_scores(scores, np.array([0, 1, 2, 4]))
    with pytest.raises(ValueError, match="integer"):
        neighbors.ranks_from_scores(scores, np.array([0.0, 1.0, 2.0, 3.0]))


def test_cosine_ranks_blocked():
    # targets at angles 0, 90, 180 deg; queries near targets 0 and 1, query 2 nearest to target 1
    src = np.array([[1.0, 0.1], [0.1, 1.0], [0.0, 1.0]])
    tgt = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    # q2 = [0,1]: cos with t0 = 0, t1 = 1, t2 = 0 -> correct t2 has one above, ties with t0 -> 1 + 1 + 1/2 = 2.5
    for bs in (1, 2, 10):
        np.testing.assert_array_equal(neighbors.cosine_ranks(src, tgt, block_size=bs), [1.0, 1.0, 2.5])


def test_mutual_knn_hand_example():
    a = np.array([[1, 2], [0, 2], [0, 1], [0, 1]])
    b = np.array([[2, 1], [2, 3], [3, 1], [2, 1]])
    # overlaps: {1,2}&{2,1}=2, {0,2}&{2,3}=1, {0,1}&{3,1}=1, {0,1}&{2,1}=1 -> 5/(4*2) = 0.625
    assert neighbors.mutual_knn(a, b) == pytest.approx(0.625)
    assert neighbors.mutual_knn(a, a) == 1.0
    assert neighbors.mutual_knn(np.array([[1], [0]]), np.array([[0], [1]])) == 0.0
    with pytest.raises(ValueError, match="repeats"):
        neighbors.mutual_knn(np.array([[1, 1], [0, 2]]), a[:2])
    with pytest.raises(ValueError, match="same shape"):
        neighbors.mutual_knn(a, b[:3])


@pytest.mark.parametrize("backend", ["faiss", "numpy"])
def test_knn_indices_hand_examples(backend):
    if backend == "faiss":
        pytest.importorskip("faiss")
    # l2 on a line: points 0, 1, 3, 7
    # 0 -> [1 (d1), 3 (d3)]; 1 -> [0 (d1), 3 (d2)]; 3 -> [1 (d2), 0 (d3)]; 7 -> [3 (d4), 1 (d6)]
    pts = np.array([[0.0], [1.0], [3.0], [7.0]])
    np.testing.assert_array_equal(
        neighbors.knn_indices(pts, 2, metric="l2", backend=backend), [[1, 2], [0, 2], [1, 0], [2, 1]]
    )
    # cosine: unit vectors at 0, 10, 30, 90 degrees (scaled to check normalisation)
    ang = np.deg2rad([0.0, 10.0, 30.0, 90.0])
    vec = np.stack([np.cos(ang), np.sin(ang)], axis=1) * np.array([[1.0], [5.0], [0.2], [3.0]])
    # nearest: 0->10, 10->0 (10 vs 20 deg), 30->10 (20 deg), 90->30 (60 deg)
    out = neighbors.knn_indices(vec, 1, metric="cosine", backend=backend, block_size=3)
    np.testing.assert_array_equal(out, [[1], [0], [1], [2]])
    assert out.dtype == np.int64


def test_knn_indices_faiss_equals_numpy_and_excludes_self():
    pytest.importorskip("faiss")
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    for metric in ("cosine", "dot", "l2"):
        a = neighbors.knn_indices(x, 7, metric=metric, backend="faiss", block_size=64)
        b = neighbors.knn_indices(x, 7, metric=metric, backend="numpy", block_size=50)
        np.testing.assert_array_equal(a, b)
        assert not np.any(a == np.arange(300)[:, None])
    # brute force check for cosine
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    sim = xn @ xn.T
    np.fill_diagonal(sim, -np.inf)
    np.testing.assert_array_equal(neighbors.knn_indices(x, 5), np.argsort(-sim, axis=1)[:, :5])


def test_knn_indices_duplicates_still_exclude_self():
    # rows 0 and 1 are identical: each must list the other, never itself
    x = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    for backend in ("numpy", "faiss"):
        if backend == "faiss":
            pytest.importorskip("faiss")
        out = neighbors.knn_indices(x, 2, backend=backend)
        assert out[0, 0] == 1 and out[1, 0] == 0
        assert not np.any(out == np.arange(4)[:, None])


@pytest.mark.parametrize("backend", ["faiss", "numpy"])
def test_knn_indices_dot_when_self_is_not_nearest(backend):
    if backend == "faiss":
        pytest.importorskip("faiss")
    # dot products of 1, 10, 5, 2: for query 1 the order is 10 (10), 5 (5), 2 (2), itself (1),
    # so itself is not in its k+1 = 2 results and the last of them (5) is dropped -> [10].
    # 10 -> [5 (50), 2 (20)]; 5 -> [10 (50), 2 (10)]; 2 -> [10 (20), 5 (10)]
    x = np.array([[1.0], [10.0], [5.0], [2.0]])
    np.testing.assert_array_equal(
        neighbors.knn_indices(x, 1, metric="dot", backend=backend), [[1], [2], [1], [1]]
    )
    np.testing.assert_array_equal(
        neighbors.knn_indices(x, 2, metric="dot", backend=backend), [[1, 2], [2, 3], [1, 3], [1, 2]]
    )


def test_knn_indices_numpy_orders_ties_by_index():
    # 12 identical rows (all cosines 1) and one orthogonal row: the numpy backend breaks
    # ties by ascending index, so row i lists the 4 smallest other indices of the group.
    x = np.vstack([np.tile([1.0, 0.0], (12, 1)), [[0.0, 1.0]]])
    out = neighbors.knn_indices(x, 4, backend="numpy")
    assert out[0].tolist() == [1, 2, 3, 4]
    assert out[2].tolist() == [0, 1, 3, 4]
    assert out[11].tolist() == [0, 1, 2, 3]
    # the orthogonal row: all cosines 0 -> the 4 smallest indices
    assert out[12].tolist() == [0, 1, 2, 3]
    # a tie group far larger than k still yields the lowest indices (argpartition alone does not)
    big = neighbors.knn_indices(np.ones((1000, 3)), 5, backend="numpy", block_size=256)
    assert big[0].tolist() == [1, 2, 3, 4, 5]
    assert big[999].tolist() == [0, 1, 2, 3, 4]
    assert big[500].tolist() == [0, 1, 2, 3, 4]


def test_knn_indices_errors():
    with pytest.raises(ValueError, match="k must"):
        neighbors.knn_indices(np.eye(3), 3)
    with pytest.raises(ValueError, match="metric"):
        neighbors.knn_indices(np.eye(3), 1, metric="manhattan")


# ---------------------------------------------------------------- CKA


def test_linear_cka_hand_3x1():
    x = np.array([[1.0], [2.0], [3.0]])
    y = np.array([[1.0], [0.0], [2.0]])
    # centred x = [-1,0,1], centred y = [0,-1,1]
    # Y^T X = 0 + 0 + 1 = 1 -> squared 1; X^T X = 2; Y^T Y = 2 -> CKA = 1/(2*2) = 0.25 (= r^2, r = 0.5)
    assert cka.linear_cka(x, y) == pytest.approx(0.25)
    assert cka._linear_cka_features(x, y) == pytest.approx(0.25)
    assert cka._linear_cka_gram(x, y) == pytest.approx(0.25)


def test_linear_cka_invariances():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 6))
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    # orthogonal transform, isotropic scale and a shift leave CKA at 1
    assert cka.linear_cka(x, 3.7 * x @ q + 5.0) == pytest.approx(1.0, abs=1e-12)
    assert cka.linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    # a non-isotropic scaling does not
    assert cka.linear_cka(x, x * np.array([1, 1, 1, 1, 1, 20.0])) < 0.99
    # symmetric
    y = rng.normal(size=(50, 3))
    assert cka.linear_cka(x, y) == pytest.approx(cka.linear_cka(y, x), abs=1e-14)


def test_linear_cka_gram_and_feature_paths_agree():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 40))  # n < d -> linear_cka uses the Gram path
    y = x[:, :10] @ rng.normal(size=(10, 7)) + 0.3 * rng.normal(size=(20, 7))
    assert cka._linear_cka_gram(x, y) == pytest.approx(cka._linear_cka_features(x, y), abs=1e-12)
    assert cka.linear_cka(x, y) == pytest.approx(cka._linear_cka_features(x, y), abs=1e-12)


def test_linear_cka_errors():
    with pytest.raises(ValueError, match="no variance"):
        cka.linear_cka(np.ones((5, 3)), np.random.default_rng(0).normal(size=(5, 2)))
    with pytest.raises(ValueError, match="same number of rows"):
        cka.linear_cka(np.eye(3), np.eye(4))


def test_linear_cka_accumulator_equals_batch():
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(257, 12)) + 30.0).astype(np.float32)  # large mean: stability check
    y = (x[:, :5] @ rng.normal(size=(5, 9))).astype(np.float32) + rng.normal(size=(257, 9)).astype(np.float32)
    acc = cka.LinearCKAAccumulator()
    for s, e in [(0, 1), (1, 50), (50, 50), (50, 200), (200, 257)]:  # includes a 1-row and an empty block
        acc.update(x[s:e], y[s:e])
    assert acc.n == 257
    assert acc.result() == pytest.approx(cka.linear_cka(x, y), abs=1e-10)
    # the same through float64 numbers computed by hand with numpy
    xc = x.astype(np.float64) - x.astype(np.float64).mean(0)
    yc = y.astype(np.float64) - y.astype(np.float64).mean(0)
    direct = np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    assert acc.result() == pytest.approx(direct, abs=1e-10)


def test_linear_cka_accumulator_errors():
    acc = cka.LinearCKAAccumulator()
    with pytest.raises(ValueError, match="at least 2"):
        acc.result()
    acc.update(np.ones((3, 2)), np.arange(6.0).reshape(3, 2))
    with pytest.raises(ValueError, match="no variance"):
        acc.result()
    with pytest.raises(ValueError, match="widths"):
        acc.update(np.ones((3, 4)), np.ones((3, 2)))


def _hsic1_direct(K, L):
    """Song et al. (2012) unbiased HSIC, written out with n x n matrices."""
    n = K.shape[0]
    K = K.copy()
    L = L.copy()
    np.fill_diagonal(K, 0.0)
    np.fill_diagonal(L, 0.0)
    one = np.ones(n)
    return (np.trace(K @ L) + (one @ K @ one) * (one @ L @ one) / ((n - 1) * (n - 2))
            - 2.0 / (n - 2) * (one @ K @ L @ one)) / (n * (n - 3))


def test_unbiased_cka_matches_direct_hsic_formula():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(15, 4)) + 2.0  # uncentred on purpose: the estimator is shift-invariant
    y = x[:, :2] @ rng.normal(size=(2, 3)) + rng.normal(size=(15, 3)) - 1.0
    K, L = x @ x.T, y @ y.T
    expected = _hsic1_direct(K, L) / math.sqrt(_hsic1_direct(K, K) * _hsic1_direct(L, L))
    assert cka.unbiased_cka(x, y) == pytest.approx(expected, abs=1e-12)
    assert cka.unbiased_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_unbiased_cka_close_to_linear_for_large_n():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(5000, 5))
    y = x @ rng.normal(size=(5, 4)) + 0.5 * rng.normal(size=(5000, 4))
    lin, unb = cka.linear_cka(x, y), cka.unbiased_cka(x, y)
    assert 0.3 < lin < 0.99
    assert abs(lin - unb) < 0.01
    # for unrelated data the debiased value is near 0 where the biased one is not
    a, b = rng.normal(size=(60, 30)), rng.normal(size=(60, 30))
    assert abs(cka.unbiased_cka(a, b)) < 0.1 < cka.linear_cka(a, b)


def test_unbiased_cka_needs_n_above_3():
    with pytest.raises(ValueError, match="n > 3"):
        cka.unbiased_cka(np.eye(3), np.eye(3))


# ---------------------------------------------------------------- effect sizes, PCA


def test_cohens_d_hand_values():
    # means 2 and 5, both variances 1 -> pooled 1 -> d = -3
    assert pca.cohens_d([1, 2, 3], [4, 5, 6]) == pytest.approx(-3.0)
    # a=[2,4]: mean 3, var 2; b=[1,2,3]: mean 2, var 1
    # pooled var = (1*2 + 2*1)/3 = 4/3 -> d = 1/sqrt(4/3) = sqrt(3)/2
    assert pca.cohens_d([2, 4], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)
    with pytest.raises(ValueError, match="pooled std is 0"):
        pca.cohens_d([1, 1], [2, 2])
    with pytest.raises(ValueError):
        pca.cohens_d([1], [2])


def test_pca_summary_hand_example():
    x = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
    # centred: [[-1,-.5],[1,-.5],[-1,.5],[1,.5]]; var x = 4/3, var y = 1/3, cov 0
    # ratios 0.8, 0.2; PC0 = [1, 0]; projections on PC0 = [-1, 1, -1, 1]
    p = pca.pca_summary(x, n_components=5)
    assert p["n_components"] == 2
    np.testing.assert_allclose(p["explained_variance"], [4 / 3, 1 / 3])
    np.testing.assert_allclose(p["explained_variance_ratio"], [0.8, 0.2])
    np.testing.assert_allclose(np.abs(p["components"]), np.eye(2), atol=1e-12)
    assert p["components"][0, 0] > 0 and p["components"][1, 1] > 0  # sign convention
    np.testing.assert_allclose(p["projections"][:, 0], [-1, 1, -1, 1], atol=1e-12)
    np.testing.assert_allclose(p["projections"][:, 1], [-0.5, -0.5, 0.5, 0.5], atol=1e-12)
    np.testing.assert_allclose(p["mean"], [1.0, 0.5])
    assert p["total_variance"] == pytest.approx(5 / 3)


def test_pca_summary_tall_path_equals_svd():
    # n > 2d takes the scatter-matrix route; compare with a direct SVD done here
    rng = np.random.default_rng(8)
    x = rng.normal(size=(300, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.2]) + 7.0
    p = pca.pca_summary(x, n_components=3)
    xc = x - x.mean(0)
    _, sv, vt = np.linalg.svd(xc, full_matrices=False)
    np.testing.assert_allclose(p["singular_values"], sv[:3], rtol=1e-10)
    np.testing.assert_allclose(p["explained_variance_ratio"], (sv[:3] ** 2) / (sv ** 2).sum(), rtol=1e-10)
    np.testing.assert_allclose(np.abs(p["components"]), np.abs(vt[:3]), atol=1e-10)
    np.testing.assert_allclose(p["projections"], xc @ p["components"].T, atol=1e-10)
    assert np.all(np.abs(p["components"]).argmax(1) == [0, 1, 2])
    assert np.all(p["components"][np.arange(3), [0, 1, 2]] > 0)


def test_language_split_on_pc0_hand_example():
    # The source/target split on PC0 as the alignment figures take it (index/alignment.py):
    # PCA of both sides stacked, then Cohen's d of the source vs target projections on PC0.
    src = np.array([[-3.0, 1.0], [-1.0, -1.0]])
    tgt = np.array([[1.0, -1.0], [3.0, 1.0]])
    # stacked x = [-3,-1,1,3], y = [1,-1,-1,1]: means 0, sum xy = -3+1-1+3 = 0
    # var x = 20/3, var y = 4/3 -> PC0 = x axis, ratio 20/24 = 5/6
    # projections: src [-3,-1] (mean -2, var 2), tgt [1,3] (mean 2, var 2)
    # pooled sd = sqrt(2) -> d = -4/sqrt(2) = -2 sqrt(2)
    r = pca.pca_summary(np.concatenate([src, tgt]), n_components=1)
    proj = r["projections"][:, 0]
    assert r["explained_variance_ratio"][0] == pytest.approx(5 / 6)
    np.testing.assert_allclose(proj, [-3.0, -1.0, 1.0, 3.0], atol=1e-12)
    assert pca.cohens_d(proj[:2], proj[2:]) == pytest.approx(-2 * math.sqrt(2))


# ---------------------------------------------------------------- quantization


def test_retention():
    assert quantization.retention(0.72, 0.8) == pytest.approx(0.9)
    assert quantization.retention(0.5, 0.0) is None
    assert quantization.retention(0.5, -0.1) is None
    with pytest.raises(ValueError):
        quantization.retention(float("nan"), 0.8)


def test_binary_quantize_and_hamming_hand_example():
    x = np.array([[1.0, -1.0, 2.0], [-1.0, -1.0, 3.0]])
    bits = quantization.binary_quantize(x)
    # row0 signs 1,0,1 -> 0b10100000 = 160; row1 0,0,1 -> 0b00100000 = 32
    np.testing.assert_array_equal(bits, [[160], [32]])
    assert bits.dtype == np.uint8 and bits.shape == (2, 1)
    # hamming(101, 001) = 1 -> with dim 3: 1 - 1/3 = 2/3; with the default dim 8: 1 - 1/8
    sim = quantization.hamming_similarity(bits[:1], bits[1:], dim=3)
    assert sim[0] == pytest.approx(2 / 3)
    assert quantization.hamming_similarity(bits[:1], bits[1:])[0] == pytest.approx(7 / 8)
    # round trip: unpacking gives back the sign pattern; zero counts as negative
    z = np.array([[0.0, 0.5, -0.5, 0.0, 1.0, 1.0, 1.0, 1.0, -2.0, 3.0]])
    unpacked = np.unpackbits(quantization.binary_quantize(z), axis=1, count=10)
    np.testing.assert_array_equal(unpacked, (z > 0).astype(np.uint8))
    with pytest.raises(ValueError, match="dim"):
        quantization.hamming_similarity(bits, bits, dim=9)


def test_hamming_similarity_relates_to_sign_cosine():
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(40, 64)), rng.normal(size=(40, 64))
    sim = quantization.hamming_similarity(quantization.binary_quantize(a), quantization.binary_quantize(b))
    # for +-1 vectors cos = 1 - 2 h/d = 2 * sim - 1
    cos = vectors.paired_cosine(np.where(a > 0, 1.0, -1.0), np.where(b > 0, 1.0, -1.0))
    np.testing.assert_allclose(2 * sim - 1, cos, atol=1e-12)


def test_int8_quantize_hand_example_and_round_trip():
    x = np.array([[0.0, 5.0], [1.0, 5.0], [2.55, 5.0]])
    codes, scale, offset = quantization.int8_quantize(x)
    # dim 0: min 0, max 2.55 -> scale 0.01, offset 0 + 128*0.01 = 1.28
    #   codes: (0-1.28)/.01 = -128; (1-1.28)/.01 = -28; (2.55-1.28)/.01 = 127
    # dim 1: constant 5 -> scale 1, offset 5, code 0
    np.testing.assert_allclose(scale, [0.01, 1.0])
    np.testing.assert_allclose(offset, [1.28, 5.0])
    np.testing.assert_array_equal(codes, [[-128, 0], [-28, 0], [127, 0]])
    assert codes.dtype == np.int8
    back = quantization.int8_dequantize(codes, scale, offset)
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, atol=1e-6)


def test_int8_round_trip_error_bound_and_calibration_clipping():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(500, 16)).astype(np.float32)
    codes, scale, offset = quantization.int8_quantize(x)
    err = np.abs(quantization.int8_dequantize(codes, scale, offset, dtype=np.float64) - x)
    assert np.all(err <= scale / 2 + 1e-6)
    assert codes.min() == -128 and codes.max() == 127
    # calibrated on a narrower range: values outside it clip to the end codes
    calib = np.array([[-1.0] * 16, [1.0] * 16])
    c2, s2, o2 = quantization.int8_quantize(np.array([[5.0] * 16, [-5.0] * 16]), calibration=calib)
    np.testing.assert_array_equal(c2, [[127] * 16, [-128] * 16])
    np.testing.assert_allclose(quantization.int8_dequantize(c2, s2, o2)[0], 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="dims"):
        quantization.int8_quantize(x, calibration=np.zeros((2, 3)))


def test_truncate_dims():
    x = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(quantization.truncate_dims(x, 2), [[0, 1], [4, 5], [8, 9]])
    assert quantization.truncate_dims(x, 4).shape == (3, 4)
    with pytest.raises(ValueError):
        quantization.truncate_dims(x, 0)
    with pytest.raises(ValueError):
        quantization.truncate_dims(x, 5)


@pytest.mark.parametrize("module", [cka, comparison, correlation, neighbors, pca, permutation, quantization, vectors])
def test_module_has_no_heavy_imports(module):
    import sys

    src = open(module.__file__, encoding="utf-8").read()
    for name in ("onnxruntime", "torch", "sentence_transformers"):
        assert f"import {name}" not in src
    assert "faiss" not in {m.split(".")[0] for m in module.__dict__}  # faiss imported lazily only
    assert module.__name__ in sys.modules
