"""Bootstrap 95% intervals of the figures an analysis reports, and its headline figures for the reports.

Every interval here is a percentile bootstrap over the analysis's items (``scipy.stats.bootstrap`` through
:mod:`layerscope.metrics.paired`), seeded from the run's ``--seed``, so the same settings give the same
intervals. A row's interval for figure ``x`` is stored beside it as ``x_ci_low`` / ``x_ci_high`` (the names
the plots and report.html read as bands and whiskers).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

N_RESAMPLES = 1000
CONFIDENCE = 0.95
_INDEX_BUDGET = 4_000_000  # resampled item indices (times what a scorer builds from each) held at once


def method(n_items: int, unit: str, seed: int, n_resamples: int = N_RESAMPLES) -> str:
    """How the intervals of a run were made, in words for results.json and the reports."""
    return (f"95% percentile bootstrap over the {n_items:,} {unit} ({n_resamples} resamples, "
            f"scipy.stats.bootstrap, seed {seed})")


def interval(scorer: Callable[[np.ndarray], np.ndarray], n_items: int, *, seed: int,
             n_resamples: int = N_RESAMPLES, cost: int = 1) -> tuple[float | None, float | None]:
    """The 95% percentile bootstrap interval of ``scorer`` (a figure as a function of item indices)."""
    from layerscope.metrics.paired import one_sample_interval

    return one_sample_interval(scorer, n_items, n_resamples=n_resamples, seed=seed, confidence_level=CONFIDENCE,
                               batch=max(1, min(n_resamples, _INDEX_BUDGET // max(1, n_items * cost))))


def mean_interval(values, *, seed: int, n_resamples: int = N_RESAMPLES) -> tuple[float | None, float | None]:
    """Interval of the mean of per-item ``values``."""
    from layerscope.metrics.paired import mean_scorer

    v = np.asarray(values, dtype=np.float64)
    return interval(mean_scorer(v), len(v), seed=seed, n_resamples=n_resamples)


def add_interval(row: dict[str, Any], key: str, scorer, n_items: int, *, seed: int, cost: int = 1,
                 n_resamples: int = N_RESAMPLES) -> dict[str, Any]:
    """Set ``row[key_ci_low]``, ``row[key_ci_high]`` (None where the figure itself is undefined)."""
    lo = hi = None
    if row.get(key) is not None and scorer is not None:
        lo, hi = interval(scorer, n_items, seed=seed, cost=cost, n_resamples=n_resamples)
    row[f"{key}_ci_low"], row[f"{key}_ci_high"] = lo, hi
    return row


def headline(figure: str, row: dict[str, Any] | None, key: str, where: str = "", **extra) -> dict[str, Any]:
    """One headline figure for the reports' summary: its value, interval and where it was measured."""
    row = row or {}
    return {"figure": figure, "value": row.get(key), "ci_low": row.get(f"{key}_ci_low"),
            "ci_high": row.get(f"{key}_ci_high"), "where": where, **extra}
