"""Model vs model on the same items: a paired bootstrap of the difference of a score.

Each model's score (Spearman of its cosines against the human scores, a win
rate, a z-score, ...) is written as a function of item indices: given an index
array of shape ``[..., n]`` (the observed items ``arange(n)``, or a batch of
resamples) it returns the score on those items, shape ``[...]``.  Both models are
scored on the *same* resampled items (``scipy.stats.bootstrap`` with
``paired=True`` resamples one index array for all samples), so what the items
share (an easy pair is easy for both models) cancels in the difference.

* ``difference``: score of A minus score of B on all items;
* ``ci_low, ci_high`` and ``p_value``: one procedure, both read from the same sorted bootstrap differences
  ``d*_(1) <= ... <= d*_(B)``.  With ``alpha = 1 - confidence_level`` and ``k = ceil(alpha / 2 * B)``, the
  interval is ``[d*_(k), d*_(B + 1 - k)]`` (the k-th smallest and k-th largest) and the two-sided p-value is
  ``2 * min(#{d* <= 0}, #{d* >= 0}) / B`` (at most 1).  The interval excludes 0 exactly when fewer than k
  resamples fall on one side of 0, which is exactly when ``p < alpha``: the two cannot disagree.  p is 1 when
  every resample's difference is 0, and 0 when none falls on one side (then p < 2 / B is all the resamples say).

Resamples whose statistic is undefined (NaN, e.g. a constant resample) are
dropped and counted in ``dropped``.  Pure numpy/scipy: no model, no I/O.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

Scorer = Callable[[np.ndarray], np.ndarray]  # item indices [..., n] -> score [...]


@dataclass
class PairedBootstrap:
    score_a: float
    score_b: float
    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    n_items: int
    n_resamples: int
    dropped: int = 0
    confidence_level: float = 0.95
    method: str = "paired percentile bootstrap"

    @property
    def significant(self) -> bool | None:
        """The interval excludes 0 (equivalently ``p_value < 1 - confidence_level``); None where undefined."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low > 0 or self.ci_high < 0

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(score_a: Scorer, score_b: Scorer, n_items: int, *, n_resamples: int = 1000, seed: int = 0,
                     confidence_level: float = 0.95, batch: int | None = None,
                     rng: np.random.Generator | None = None) -> PairedBootstrap:
    """Difference ``score_a - score_b`` over ``n_items`` shared items, with its CI and two-sided p-value.

    ``rng`` (default ``np.random.default_rng(seed)``) draws the resampled indices; ``batch`` bounds how many
    resamples are scored at once (memory is ``batch * n`` indices plus what the scorers make of them).
    """
    from scipy import stats

    n = int(n_items)
    if n < 2:
        raise ValueError(f"a paired bootstrap needs at least 2 items, got {n}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    if not 0.0 < confidence_level < 1.0:
        raise ValueError(f"confidence_level must be between 0 and 1 (exclusive), got {confidence_level}")
    items = np.arange(n)
    a, b = float(score_a(items)), float(score_b(items))
    observed = a - b
    if not (math.isfinite(a) and math.isfinite(b)):
        return PairedBootstrap(a if math.isfinite(a) else None, b if math.isfinite(b) else None, None, None, None,
                               None, n, int(n_resamples), 0, confidence_level)

    def statistic(idx_a, idx_b, axis=-1):
        # paired=True hands both samples the same resampled positions; the samples hold item indices.
        return np.asarray(score_a(np.asarray(idx_a)), dtype=np.float64) - np.asarray(
            score_b(np.asarray(idx_b)), dtype=np.float64)

    with warnings.catch_warnings():  # undefined resamples make scipy warn; they are counted in `dropped` instead
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((items, items), statistic, paired=True, vectorized=True, n_resamples=int(n_resamples),
                              batch=batch, method="percentile", confidence_level=confidence_level,
                              rng=rng if rng is not None else np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64).reshape(-1)
    finite = dist[np.isfinite(dist)]
    dropped = int(dist.size - finite.size)
    if finite.size == 0:
        return PairedBootstrap(a, b, observed, None, None, None, n, int(n_resamples), dropped, confidence_level)
    lo, hi, p = interval_and_p(finite, confidence_level)
    return PairedBootstrap(a, b, observed, lo, hi, p, n, int(n_resamples), dropped, confidence_level)


def tail_count(n_resamples: int, confidence_level: float) -> int:
    """k = ceil(alpha / 2 * B): how many resamples each end of the interval leaves out, plus one."""
    alpha = round(1.0 - confidence_level, 12)
    return max(1, math.ceil(round(alpha / 2.0 * n_resamples, 9)))


def interval_and_p(differences, confidence_level: float = 0.95) -> tuple[float, float, float]:
    """The interval ``[d*_(k), d*_(B+1-k)]`` and the two-sided p ``2 min(#{d* <= 0}, #{d* >= 0}) / B`` of
    bootstrap differences (see the module text): 0 lies outside the interval exactly when p < alpha."""
    d = np.sort(np.asarray(differences, dtype=np.float64).reshape(-1))
    count = d.size
    if count == 0 or not np.isfinite(d).all():
        raise ValueError("interval_and_p needs at least one finite bootstrap difference")
    k = min(tail_count(count, confidence_level), count)
    below, above = int(np.count_nonzero(d <= 0)), int(np.count_nonzero(d >= 0))
    return float(d[k - 1]), float(d[count - k]), min(1.0, 2.0 * min(below, above) / count)


def holm(p_values) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (None stays None and is not counted):
    the i-th smallest of m becomes ``max_{j <= i} min(1, (m - j + 1) p_(j))``."""
    given = list(p_values)
    ps = [(i, float(p)) for i, p in enumerate(given) if p is not None]
    out: list[float | None] = [None] * len(given)
    m, running = len(ps), 0.0
    for rank, (i, p) in enumerate(sorted(ps, key=lambda t: t[1])):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def one_sample_interval(score: Scorer, n_items: int, *, n_resamples: int = 1000, seed: int = 0,
                        confidence_level: float = 0.95, batch: int | None = None) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of one model's score over its items (for scores the analysis gives no CI)."""
    from scipy import stats

    n = int(n_items)
    if n < 2:
        return None, None
    items = np.arange(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((items,), lambda idx, axis=-1: np.asarray(score(np.asarray(idx)), dtype=np.float64),
                              vectorized=True, n_resamples=int(n_resamples), batch=batch, method="percentile",
                              confidence_level=confidence_level, rng=np.random.default_rng(seed))
    dist = np.asarray(res.bootstrap_distribution, dtype=np.float64).reshape(-1)
    finite = dist[np.isfinite(dist)]
    if finite.size < 2:
        return None, None
    alpha = (1.0 - confidence_level) / 2.0
    lo, hi = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


# ---------------------------------------------------------------- scorers of per-item data

def _rowwise_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    xc = x - x.mean(axis=-1, keepdims=True)
    yc = y - y.mean(axis=-1, keepdims=True)
    num = (xc * yc).sum(axis=-1)
    den = np.sqrt((xc * xc).sum(axis=-1) * (yc * yc).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def correlation_scorer(values, targets, kind: str = "spearman") -> Scorer:
    """Spearman (average ranks for ties) or Pearson of per-item ``values`` against ``targets`` on the given items."""
    from scipy.stats import rankdata

    v = np.asarray(values, dtype=np.float64)
    t = np.asarray(targets, dtype=np.float64)
    if v.shape != t.shape or v.ndim != 1:
        raise ValueError(f"values and targets must be 1-D of one length, got {v.shape} and {t.shape}")
    if kind not in ("spearman", "pearson"):
        raise ValueError(f"kind must be spearman or pearson, not {kind!r}")

    def score(idx: np.ndarray) -> np.ndarray:
        x, y = v[idx], t[idx]
        if kind == "spearman":
            x, y = rankdata(x, axis=-1), rankdata(y, axis=-1)
        return _rowwise_pearson(x, y)

    return score


def win_rate_scorer(diffs) -> Scorer:
    """Share of the given items whose difference is > 0 (ties count as not won)."""
    d = np.asarray(diffs, dtype=np.float64)
    return lambda idx: (d[idx] > 0).mean(axis=-1)


def ratio_scorer(numerators, denominators) -> Scorer:
    """``sum(numerators) / sum(denominators)`` over the given items: a share of positions counted per text
    (the positions of one text resample together); NaN where the items hold no position."""
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"numerators and denominators must be 1-D of one length, got {num.shape} and {den.shape}")

    def score(idx: np.ndarray) -> np.ndarray:
        top, bottom = num[idx].sum(axis=-1), den[idx].sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1.0), np.nan)

    return score


def mean_scorer(values) -> Scorer:
    v = np.asarray(values, dtype=np.float64)
    return lambda idx: v[idx].mean(axis=-1)


def gram_z_scorer(gram) -> Scorer:
    """Matched-vs-scrambled z of the given pairs from ``G[i, j] = cos(source_i, target_j)``.

    Exact permutation moments (Hoeffding): matched = mean of the diagonal, scrambled mean = mean of all
    entries, variance = sum of the doubly centred entries squared / (n^2 (n - 1)); z = (matched - mean) / std.
    A pair drawn twice by a resample counts as two pairs (its off-diagonal copy is a matched cosine), as the
    bootstrap's own world has it.
    """
    G = np.asarray(gram, dtype=np.float64)
    if G.ndim != 2 or G.shape[0] != G.shape[1]:
        raise ValueError(f"gram must be a square matrix, got shape {G.shape}")

    def score(idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        n = idx.shape[-1]
        sub = G[idx[..., :, None], idx[..., None, :]]
        matched = np.diagonal(sub, axis1=-2, axis2=-1).mean(axis=-1)
        rows = sub.mean(axis=-1, keepdims=True)
        cols = sub.mean(axis=-2, keepdims=True)
        grand = sub.mean(axis=(-2, -1), keepdims=True)
        d = sub - rows - cols + grand
        var = (d * d).sum(axis=(-2, -1)) / (n * n * (n - 1))
        std = np.sqrt(np.maximum(var, 0.0))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(std > 1e-12, (matched - grand[..., 0, 0]) / np.where(std > 1e-12, std, 1.0), np.nan)

    return score
