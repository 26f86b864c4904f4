"""Binomial intervals of a share against SciPy's binomtest, at the edges and in between."""

from __future__ import annotations

import pytest
from scipy.stats import binomtest

from layerscope.metrics.proportion import clopper_pearson_interval, proportion_interval, wilson_interval


@pytest.mark.parametrize("method", ["wilson", "clopper-pearson"])
@pytest.mark.parametrize("k,n", [(0, 48), (48, 48), (1, 48), (17, 48), (0, 1), (1, 1), (3, 10), (250, 1000)])
def test_intervals_equal_scipy_binomtest(method, k, n):
    want = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact" if method != "wilson" else "wilson")
    assert proportion_interval(k, n, method) == pytest.approx((want.low, want.high), abs=1e-12)


def test_zero_of_48_is_not_a_point():
    lo, hi = clopper_pearson_interval(0, 48)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 48)) and round(hi, 3) == 0.074
    lo, hi = wilson_interval(0, 48)
    assert lo == 0.0 and hi == pytest.approx(1.959963984540054 ** 2 / (48 + 1.959963984540054 ** 2))
    lo, hi = wilson_interval(48, 48)
    assert hi == 1.0 and lo == pytest.approx(48 / (48 + 1.959963984540054 ** 2))


def test_fractional_successes_lie_between_their_whole_neighbours():
    """A share counted with ties as expectations (7.5 of 20) gets an interval between those of 7 and 8."""
    for method in ("wilson", "clopper-pearson"):
        lo7, hi7 = proportion_interval(7, 20, method)
        lo, hi = proportion_interval(7.5, 20, method)
        lo8, hi8 = proportion_interval(8, 20, method)
        assert lo7 < lo < lo8 and hi7 < hi < hi8


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="at least 1 trial"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match="successes must lie"):
        wilson_interval(5, 4)
    with pytest.raises(ValueError, match="method must be"):
        proportion_interval(1, 4, "wald")
