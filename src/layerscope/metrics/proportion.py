"""Confidence intervals of a proportion that stay valid at 0 and 1 (Wilson score, Clopper-Pearson).

A percentile bootstrap of a share that is 0 (or 1) on every item resamples to 0 every time and gives an
interval of width zero; these binomial intervals give 0/48 an upper end near 0.074 instead.
``successes`` may be fractional (a retrieval hit counted as its expectation over a random order of tied
candidates): the Wilson interval is a function of the observed share, and the Clopper-Pearson interval's
beta quantiles are defined for real counts; for whole counts both equal
``scipy.stats.binomtest(k, n).proportion_ci(method=...)``.
"""

from __future__ import annotations

import math

METHODS = ("wilson", "clopper-pearson")


def _check(successes: float, n: int, confidence: float) -> None:
    if n < 1:
        raise ValueError(f"a proportion needs at least 1 trial, got n={n}")
    if not 0.0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n] = [0, {n}], got {successes}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be between 0 and 1 (exclusive), got {confidence}")


def wilson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of ``successes / n`` (no continuity correction)."""
    from scipy.stats import norm

    _check(successes, n, confidence)
    z = float(norm.ppf(0.5 + confidence / 2.0))
    p = successes / n
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n))
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)  # exactly 0 and 1 at the edges, not rounding
    hi = 1.0 if successes >= n else min(1.0, centre + half)
    return lo, hi


def clopper_pearson_interval(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson ("exact") interval of ``successes / n``: beta quantiles, 0 and 1 at the edges."""
    from scipy.stats import beta

    _check(successes, n, confidence)
    alpha = 1.0 - confidence
    lo = 0.0 if successes <= 0 else float(beta.ppf(alpha / 2.0, successes, n - successes + 1))
    hi = 1.0 if successes >= n else float(beta.ppf(1.0 - alpha / 2.0, successes + 1, n - successes))
    return lo, hi


def proportion_interval(successes: float, n: int, method: str = "wilson",
                        confidence: float = 0.95) -> tuple[float, float]:
    """The ``method`` ("wilson" or "clopper-pearson") interval of ``successes / n``."""
    if method == "wilson":
        return wilson_interval(successes, n, confidence)
    if method == "clopper-pearson":
        return clopper_pearson_interval(successes, n, confidence)
    raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
