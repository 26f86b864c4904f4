"""95% intervals of the figures an analysis reports, and its headline figures for the reports.

Two kinds, each named where it is stored:

* a share of independent items (a win rate, acc@k): the Wilson score interval
  (:mod:`layerscope.metrics.proportion`), valid at 0 and 1 -- ``ci_method`` ``"wilson"``;
* every other figure: a percentile bootstrap over the analysis's items (``scipy.stats.bootstrap`` through
  :mod:`layerscope.metrics.paired`), seeded from the run's ``--seed`` so that the same settings give the same
  intervals -- ``ci_method`` ``"bootstrap-percentile"`` (or a more specific name an analysis gives).

A row's interval for figure ``x`` is stored beside it as ``x_ci_low`` / ``x_ci_high`` (the names the plots
and report.html read as bands and whiskers) and ``x_ci_method``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

N_RESAMPLES = 1000
CONFIDENCE = 0.95
BOOTSTRAP = "bootstrap-percentile"
WILSON = "wilson"
_INDEX_BUDGET = 4_000_000  # resampled item indices (times what a scorer builds from each) held at once


def method(n_items: int, unit: str, seed: int, n_resamples: int = N_RESAMPLES, shares: str = "") -> str:
    """How the intervals of a run were made, in words for results.json and the reports; ``shares`` names the
    figures that are shares of the items and get a Wilson interval instead."""
    boot = (f"percentile bootstrap over the {n_items:,} {unit} ({n_resamples} resamples, "
            f"scipy.stats.bootstrap, seed {seed})")
    if not shares:
        return f"95% {boot}"
    return f"95%; {shares}: Wilson score interval over the {n_items:,} {unit}; other figures: {boot}"


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
                 n_resamples: int = N_RESAMPLES, ci_method: str = BOOTSTRAP) -> dict[str, Any]:
    """Set ``row[key_ci_low]``, ``row[key_ci_high]`` (None where the figure itself is undefined), a percentile
    bootstrap of ``scorer``, and ``row[key_ci_method]``."""
    lo = hi = None
    if row.get(key) is not None and scorer is not None:
        lo, hi = interval(scorer, n_items, seed=seed, cost=cost, n_resamples=n_resamples)
    row[f"{key}_ci_low"], row[f"{key}_ci_high"], row[f"{key}_ci_method"] = lo, hi, ci_method
    return row


def add_share_interval(row: dict[str, Any], key: str, successes: float, n_items: int) -> dict[str, Any]:
    """Set the Wilson interval of the share ``row[key] = successes / n_items`` of independent items (a
    success may be fractional: an expectation over tied orders); None where the share is undefined."""
    from layerscope.metrics.proportion import wilson_interval

    lo = hi = None
    if row.get(key) is not None and n_items > 0:
        lo, hi = wilson_interval(min(max(float(successes), 0.0), n_items), n_items, CONFIDENCE)
    row[f"{key}_ci_low"], row[f"{key}_ci_high"], row[f"{key}_ci_method"] = lo, hi, WILSON
    return row


def headline(figure: str, row: dict[str, Any] | None, key: str, where: str = "", **extra) -> dict[str, Any]:
    """One headline figure for the reports' summary: its value, interval and where it was measured."""
    row = row or {}
    return {"figure": figure, "value": row.get(key), "ci_low": row.get(f"{key}_ci_low"),
            "ci_high": row.get(f"{key}_ci_high"), "ci_method": row.get(f"{key}_ci_method"), "where": where,
            **extra}
