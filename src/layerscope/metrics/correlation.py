"""Correlations: Pearson and Spearman with a seeded percentile bootstrap interval."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from layerscope.metrics.checks import BLOCK_ELEMENTS, as_vector, check_finite



@dataclass
class Correlation:
    """A correlation with its p-value and bootstrap percentile interval.

    ``undefined`` holds the reason when the correlation is not defined (for
    example constant input); ``value``, ``p_value`` and the interval are then
    ``None``. ``ci_low``/``ci_high`` are also ``None`` when no bootstrap was
    asked for (``n_boot=0``) or too few resamples were usable.
    """

    value: float | None
    p_value: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    undefined: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _validate_pair(x, y, x_name: str, y_name: str) -> tuple[np.ndarray, np.ndarray]:
    X = as_vector(x, x_name)
    Y = as_vector(y, y_name)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"{x_name} and {y_name} must have the same length, got {X.shape[0]} and {Y.shape[0]}"
        )
    check_finite(X, x_name)
    check_finite(Y, y_name)
    if X.shape[0] < 3:
        raise ValueError(f"a correlation needs at least 3 pairs, got {X.shape[0]}")
    return X.astype(np.float64), Y.astype(np.float64)


def _constant_reason(x: np.ndarray, y: np.ndarray, x_name: str, y_name: str) -> str | None:
    reasons = []
    for arr, name in ((x, x_name), (y, y_name)):
        if np.all(arr == arr[0]):
            reasons.append(f"constant input ({name}): all {arr.shape[0]} values equal {arr[0]:.6g}")
    if not reasons:
        return None
    return "; ".join(reasons) + ", so the correlation is undefined"


def _rowwise_pearson(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of ``[b, n]`` arrays; a constant row gives NaN (no 0/0 warning)."""
    xc = xs - xs.mean(axis=-1, keepdims=True)
    yc = ys - ys.mean(axis=-1, keepdims=True)
    num = np.einsum("...j,...j->...", xc, yc)
    den = np.sqrt(np.einsum("...j,...j->...", xc, xc) * np.einsum("...j,...j->...", yc, yc))
    r = np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)
    return np.clip(r, -1.0, 1.0)


def _rowwise_spearman(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    return _rowwise_pearson(stats.rankdata(xs, axis=-1), stats.rankdata(ys, axis=-1))


def _bootstrap_interval(
    x: np.ndarray, y: np.ndarray, rowwise, n_boot: int, seed: int, ci: float
) -> tuple[float | None, float | None]:
    """Seeded percentile bootstrap over pairs: ``scipy.stats.bootstrap(paired=True, method="percentile")``.

    SciPy draws ``rng.integers(0, n, (batch, n))`` per batch from
    ``np.random.default_rng(seed)`` and takes the percentiles with linear
    interpolation. A resample in which either side is constant has no
    correlation: its statistic is NaN and it is left out of the percentiles
    (SciPy alone would return a NaN interval as soon as one resample is NaN).
    """
    if n_boot == 0:
        return None, None
    n = x.shape[0]

    def statistic(xs: np.ndarray, ys: np.ndarray, axis: int = -1) -> np.ndarray:
        usable = (xs.max(axis=-1) > xs.min(axis=-1)) & (ys.max(axis=-1) > ys.min(axis=-1))
        out = np.full(xs.shape[:-1], np.nan)
        if usable.any():
            out[usable] = rowwise(xs[usable], ys[usable])
        return out

    common = dict(paired=True, vectorized=True, confidence_level=ci, method="percentile")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap((x, y), statistic, n_resamples=n_boot, batch=max(1, min(n_boot, BLOCK_ELEMENTS // n)),
                              rng=np.random.default_rng(seed), **common)
        vals = res.bootstrap_distribution
        finite = vals[np.isfinite(vals)]
        if finite.size < 2:
            return None, None
        if finite.size < vals.size:  # percentiles of the usable resamples only
            res = stats.bootstrap((x, y), statistic, n_resamples=0, bootstrap_result=_Distribution(finite), **common)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass
class _Distribution:
    """A bootstrap distribution handed back to ``scipy.stats.bootstrap`` for its percentiles."""

    bootstrap_distribution: np.ndarray


def _correlation(x, y, *, kind, n_boot, seed, ci, x_name, y_name) -> Correlation:
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be between 0 and 1 (exclusive), got {ci}")
    if n_boot < 0:
        raise ValueError(f"n_boot must be >= 0, got {n_boot}")
    X, Y = _validate_pair(x, y, x_name, y_name)
    n = X.shape[0]
    reason = _constant_reason(X, Y, x_name, y_name)
    if reason is not None:
        return Correlation(None, None, None, None, n, reason)
    scipy_fn, rowwise = (
        (stats.pearsonr, _rowwise_pearson) if kind == "pearson" else (stats.spearmanr, _rowwise_spearman)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name in ("ConstantInputWarning", "NearConstantInputWarning"):
            cls = getattr(stats, name, None)
            if cls is not None:
                warnings.simplefilter("ignore", cls)
        res = scipy_fn(X, Y)
    value, p_value = float(res[0]), float(res[1])
    if not math.isfinite(value):
        return Correlation(
            None, None, None, None, n,
            f"the {kind} correlation is not finite for this input (near-constant values)",
        )
    lo, hi = _bootstrap_interval(X, Y, rowwise, n_boot, seed, ci)
    return Correlation(
        float(np.clip(value, -1.0, 1.0)),
        p_value if math.isfinite(p_value) else None,
        lo,
        hi,
        n,
        None,
    )


def pearson(
    x, y, *, n_boot: int = 1000, seed: int = 0, ci: float = 0.95,
    x_name: str = "x", y_name: str = "y",
) -> Correlation:
    """Pearson r (``scipy.stats.pearsonr``) with a percentile bootstrap interval.

    Constant input gives ``undefined`` with the reason, never NaN. Fewer than
    3 pairs, mismatched lengths or NaN/inf values raise ``ValueError``. The
    bootstrap resamples pairs with ``np.random.default_rng(seed)`` and skips
    resamples in which either side is constant. ``x_name``/``y_name`` only
    label the messages.
    """
    return _correlation(x, y, kind="pearson", n_boot=n_boot, seed=seed, ci=ci,
                        x_name=x_name, y_name=y_name)


def spearman(
    x, y, *, n_boot: int = 1000, seed: int = 0, ci: float = 0.95,
    x_name: str = "x", y_name: str = "y",
) -> Correlation:
    """Spearman rho (``scipy.stats.spearmanr``, ties get average ranks); as :func:`pearson`."""
    return _correlation(x, y, kind="spearman", n_boot=n_boot, seed=seed, ci=ci,
                        x_name=x_name, y_name=y_name)

