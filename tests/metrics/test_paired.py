"""metrics/paired.py: the paired bootstrap of a score difference, checked against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from layerscope.metrics.paired import (correlation_scorer, gram_z_scorer, mean_scorer, one_sample_interval,
                                       paired_bootstrap, win_rate_scorer)


class FixedResamples(np.random.Generator):
    """A generator whose integers() hands out a fixed resample set (rows = resamples of item indices)."""

    def __init__(self, rows):
        super().__init__(np.random.PCG64(0))
        self.rows = np.asarray(rows)
        self.calls = []

    def integers(self, low, high=None, size=None, **kwargs):
        self.calls.append((low, high, size))
        assert tuple(size) == self.rows.shape
        return self.rows.copy()


def test_fixed_resample_set_matches_hand_computation():
    # per-item wins of model A and model B on 4 items: A wins 3/4, B wins 1/4, observed difference 0.5
    a, b = np.array([1.0, 0, 1, 1]), np.array([0.0, 0, 1, 0])
    rows = [[0, 0, 0, 0],   # A 1,    B 0    -> 1.0
            [1, 1, 1, 1],   # A 0,    B 0    -> 0.0
            [0, 1, 2, 3],   # A 0.75, B 0.25 -> 0.5
            [3, 3, 2, 1]]   # A 0.75, B 0.25 -> 0.5
    rng = FixedResamples(rows)
    r = paired_bootstrap(mean_scorer(a), mean_scorer(b), 4, n_resamples=4, rng=rng)
    assert rng.calls == [(0, 4, (4, 4))]  # one index draw serves both models (paired)
    assert (r.score_a, r.score_b, r.difference) == (0.75, 0.25, 0.5)
    # sorted bootstrap differences 0, .5, .5, 1; k = ceil(.025 * 4) = 1: the smallest and the largest
    assert r.ci_low == 0.0
    assert r.ci_high == 1.0
    # one resample <= 0, four >= 0: p = 2 * 1 / 4
    assert r.p_value == pytest.approx(0.5)
    assert r.n_items == 4 and r.n_resamples == 4 and r.dropped == 0


def test_constant_offset_gives_exact_difference_and_smallest_p():
    rng = np.random.default_rng(1)
    base = rng.normal(size=50)
    r = paired_bootstrap(mean_scorer(base + 0.3), mean_scorer(base), 50, n_resamples=200, seed=3)
    # resampling the same items for both models cancels every item's own value: each resample differs by 0.3
    assert r.difference == pytest.approx(0.3)
    assert r.ci_low == pytest.approx(0.3) and r.ci_high == pytest.approx(0.3)
    assert r.p_value == 0.0  # no resample on the other side of 0


def test_same_ranks_means_zero_spearman_difference():
    rng = np.random.default_rng(2)
    human = rng.uniform(0, 5, size=40)
    cos_b = human + rng.normal(scale=1.0, size=40)
    cos_a = np.exp(cos_b)  # a monotone transform: same ranks, so the same Spearman on any resample
    r = paired_bootstrap(correlation_scorer(cos_a, human), correlation_scorer(cos_b, human), 40, n_resamples=300)
    assert r.difference == pytest.approx(0.0, abs=1e-12)
    assert r.ci_low == pytest.approx(0.0, abs=1e-12) and r.ci_high == pytest.approx(0.0, abs=1e-12)
    assert r.p_value == 1.0


def test_clear_difference_is_significant_and_interval_brackets_it():
    rng = np.random.default_rng(4)
    human = rng.uniform(0, 5, size=300)
    good = human + rng.normal(scale=0.5, size=300)
    bad = human + rng.normal(scale=4.0, size=300)
    r = paired_bootstrap(correlation_scorer(good, human), correlation_scorer(bad, human), 300, n_resamples=500)
    assert r.score_a == pytest.approx(spearmanr(good, human)[0])
    assert r.score_b == pytest.approx(spearmanr(bad, human)[0])
    assert 0 < r.ci_low < r.difference < r.ci_high
    assert r.p_value == 0.0
    swapped = paired_bootstrap(correlation_scorer(bad, human), correlation_scorer(good, human), 300, n_resamples=500)
    assert swapped.difference == pytest.approx(-r.difference)
    assert swapped.ci_high < 0


def test_scorers_on_all_items_equal_the_plain_figures():
    from layerscope.metrics.permutation import scrambled_z_exact

    rng = np.random.default_rng(5)
    x, y = rng.normal(size=30), rng.normal(size=30)
    items = np.arange(30)
    assert correlation_scorer(x, y)(items) == pytest.approx(spearmanr(x, y)[0])
    assert correlation_scorer(x, y, "pearson")(items) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert win_rate_scorer(np.array([0.2, -0.1, 0.0, 0.3]))(np.arange(4)) == 0.5  # a tie is not a win
    S = rng.normal(size=(12, 8))
    T = S + rng.normal(scale=0.7, size=(12, 8))
    Su = S / np.linalg.norm(S, axis=1, keepdims=True)
    Tu = T / np.linalg.norm(T, axis=1, keepdims=True)
    assert gram_z_scorer(Su @ Tu.T)(np.arange(12)) == pytest.approx(scrambled_z_exact(S, T)["z"])
    batch = gram_z_scorer(Su @ Tu.T)(np.stack([np.arange(12), np.arange(12)[::-1]]))
    assert batch.shape == (2,) and batch[0] == pytest.approx(batch[1])  # z does not depend on the pairs' order


def test_undefined_resamples_are_dropped_and_counted():
    # two of four items only: resamples drawing one item twice give constant values and an undefined Spearman
    x, y = np.array([0.1, 0.9, 0.5]), np.array([1.0, 3.0, 2.0])
    rng = FixedResamples([[0, 0, 0], [0, 1, 2], [2, 1, 0]])
    r = paired_bootstrap(correlation_scorer(x, y), correlation_scorer(-x, y), 3, n_resamples=3, rng=rng)
    assert r.dropped == 1
    assert r.difference == pytest.approx(2.0) and r.ci_low == pytest.approx(2.0) and r.ci_high == pytest.approx(2.0)


def test_bad_arguments_say_what_to_fix():
    with pytest.raises(ValueError, match="at least 2 items"):
        paired_bootstrap(mean_scorer([1.0]), mean_scorer([1.0]), 1)
    with pytest.raises(ValueError, match="n_resamples"):
        paired_bootstrap(mean_scorer([1.0, 2]), mean_scorer([1.0, 2]), 2, n_resamples=0)
    with pytest.raises(ValueError, match="same length|one length"):
        correlation_scorer([1.0, 2], [1.0, 2, 3])


def test_one_sample_interval_brackets_the_score():
    rng = np.random.default_rng(6)
    diffs = rng.normal(loc=0.2, size=80)
    lo, hi = one_sample_interval(win_rate_scorer(diffs), 80, n_resamples=400)
    rate = float((diffs > 0).mean())
    assert lo < rate < hi and 0 <= lo and hi <= 1


def _hand_interval_and_p(d, level):
    """The k-th smallest and k-th largest of B sorted differences, k = ceil((1 - level) / 2 * B), and
    p = 2 * min(#{d <= 0}, #{d >= 0}) / B, counted one by one."""
    from fractions import Fraction

    d = sorted(float(x) for x in d)
    B = len(d)
    tail = (1 - Fraction(str(level))) / 2 * B
    k = max(1, -(-tail.numerator // tail.denominator))
    below = sum(1 for x in d if x <= 0)
    above = sum(1 for x in d if x >= 0)
    return d[k - 1], d[B - k], min(Fraction(1), Fraction(2 * min(below, above), B))


def test_interval_and_p_match_a_hand_count():
    from layerscope.metrics.paired import interval_and_p

    d = [0.3, -0.1, 0.2, 0.0, 0.5, 0.4, -0.2, 0.1, 0.6, 0.25]
    # B = 10, k = ceil(.25) = 1: [-0.2, 0.6]; 3 values <= 0 and 8 >= 0: p = 6 / 10
    assert interval_and_p(d, 0.95) == (-0.2, 0.6, 0.6)
    # level 0.5: k = ceil(2.5) = 3: third smallest 0.0, third largest 0.4
    assert interval_and_p(d, 0.5) == (0.0, 0.4, 0.6)
    rng = np.random.default_rng(11)
    for level in (0.95, 0.9, 0.5):
        x = rng.normal(0.1, 0.3, size=997)
        lo, hi, p = interval_and_p(x, level)
        hlo, hhi, hp = _hand_interval_and_p(x, level)
        assert (lo, hi) == (hlo, hhi) and p == pytest.approx(float(hp), abs=1e-15)


def test_interval_excluding_zero_and_p_above_alpha_cannot_both_happen():
    """Every resample set, skewed, discrete, tied or at the boundary: the interval excludes 0 exactly when
    p < alpha (the contradiction 'interval excludes 0, p > 0.05' has no input that makes it)."""
    from layerscope.metrics.paired import interval_and_p

    rng = np.random.default_rng(12)
    checked = {True: 0, False: 0}
    for trial in range(3000):
        B = int(rng.choice([20, 40, 199, 200, 1000]))
        kind = trial % 4
        if kind == 0:  # skewed: a lognormal shifted around 0
            d = rng.lognormal(0, 1.0, size=B) - rng.uniform(0, 3)
        elif kind == 1:  # discrete with many ties at 0 (win rates on few items)
            d = rng.integers(-2, 6, size=B) / 8.0
        elif kind == 2:  # exactly k - 1, k or k + 1 resamples at or below 0
            k = int(np.ceil(round(0.025 * B, 9)))
            m = max(0, k + int(rng.integers(-1, 2)))
            d = np.concatenate([-rng.uniform(0, 1, size=m), rng.uniform(0.01, 1, size=B - m)])
        else:
            d = rng.normal(rng.uniform(-0.5, 0.5), 0.2, size=B)
        for level in (0.95, 0.9):
            lo, hi, p = interval_and_p(d, level)
            excludes = lo > 0 or hi < 0
            assert excludes == (p < round(1 - level, 12)), (B, level, lo, hi, p)
            assert lo <= hi
            checked[excludes] += 1
    assert checked[True] > 100 and checked[False] > 100  # both outcomes were met


def test_paired_bootstrap_significance_agrees_with_its_p():
    rng = np.random.default_rng(13)
    for shift in (0.0, 0.05, 0.1, 0.2, 0.4):
        base = rng.normal(size=30)
        a = base + shift + rng.normal(scale=1.0, size=30)
        r = paired_bootstrap(mean_scorer(a), mean_scorer(base), 30, n_resamples=199, seed=int(shift * 10))
        assert r.significant == (r.p_value < 0.05)
        assert r.ci_low <= r.ci_high


def test_holm_matches_the_step_down_formula_by_hand():
    from layerscope.metrics.paired import holm

    p = [0.01, 0.04, 0.03, None, 0.005, 0.5]
    # m = 5 defined; sorted 0.005, 0.01, 0.03, 0.04, 0.5 times 5, 4, 3, 2, 1:
    # 0.025, 0.04, 0.09, 0.08 -> running max 0.09, 0.5
    got = holm(p)
    assert got[3] is None
    assert got[4] == pytest.approx(0.025)
    assert got[0] == pytest.approx(0.04)
    assert got[2] == pytest.approx(0.09)
    assert got[1] == pytest.approx(0.09)  # 2 * 0.04 = 0.08, but never below an earlier step
    assert got[5] == pytest.approx(0.5)
    assert holm([0.3, 0.4]) == pytest.approx([0.6, 0.6])  # capped by the running max, 2 * .3 then max(.6, .4)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1
    rng = np.random.default_rng(14)
    for _ in range(50):  # the statsmodels formula: adj = maximum.accumulate(min(1, (m - i) p_sorted))
        ps = rng.uniform(0, 0.2, size=int(rng.integers(1, 12)))
        order = np.argsort(ps)
        m = ps.size
        adj_sorted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ps[order]))
        expected = np.empty(m)
        expected[order] = adj_sorted
        assert holm(list(ps)) == pytest.approx(list(expected))


def test_no_bootstrap_run_reports_an_interval_and_a_p_that_disagree():
    """Skewed per-item differences on few items (where a percentile interval and a null-shifted p part ways):
    whatever the seed, an interval excluding 0 comes with p < 0.05 and one holding 0 with p >= 0.05."""
    rng = np.random.default_rng(15)
    seen = {True: 0, False: 0}
    for seed in range(150):
        n = int(rng.integers(8, 25))
        base = rng.normal(size=n)
        a = base + rng.exponential(0.6, size=n) - rng.uniform(0.1, 0.6)
        r = paired_bootstrap(mean_scorer(a), mean_scorer(base), n, n_resamples=200, seed=seed)
        excludes = r.ci_low > 0 or r.ci_high < 0
        assert excludes == (r.p_value < 0.05), (seed, r.ci_low, r.ci_high, r.p_value)
        seen[excludes] += 1
    assert seen[True] and seen[False]
