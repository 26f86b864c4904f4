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
    # sorted bootstrap differences 0, .5, .5, 1; linear quantiles at .025 and .975
    assert r.ci_low == pytest.approx(0.0375)
    assert r.ci_high == pytest.approx(0.9625)
    # |d* - .5| >= .5 for the resamples giving 0 and 1: p = (1 + 2) / (1 + 4)
    assert r.p_value == pytest.approx(0.6)
    assert r.n_items == 4 and r.n_resamples == 4 and r.dropped == 0


def test_constant_offset_gives_exact_difference_and_smallest_p():
    rng = np.random.default_rng(1)
    base = rng.normal(size=50)
    r = paired_bootstrap(mean_scorer(base + 0.3), mean_scorer(base), 50, n_resamples=200, seed=3)
    # resampling the same items for both models cancels every item's own value: each resample differs by 0.3
    assert r.difference == pytest.approx(0.3)
    assert r.ci_low == pytest.approx(0.3) and r.ci_high == pytest.approx(0.3)
    assert r.p_value == pytest.approx(1 / 201)


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
    assert r.p_value == pytest.approx(1 / 501)
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
