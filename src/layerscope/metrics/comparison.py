"""Paired comparisons: sign test, per-item differences, the compositionality summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from layerscope.metrics.checks import as_vector, check_finite



def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial (sign) test p-value of ``wins`` vs ``losses``.

    Ties are excluded by the caller. With no decisive pair at all the test has
    no evidence either way and returns 1.0.
    """
    wins, losses = int(wins), int(losses)
    if wins < 0 or losses < 0:
        raise ValueError(f"wins and losses must be >= 0, got {wins} and {losses}")
    if wins + losses == 0:
        return 1.0
    return float(stats.binomtest(wins, wins + losses, 0.5, alternative="two-sided").pvalue)


@dataclass
class PairedDifference:
    """Summary of per-item differences (positive = the first condition wins).

    ``std`` is the sample standard deviation (ddof=1), ``None`` for one item.
    ``win_rate`` is the share of *all* items with a positive difference (ties
    count in the denominator); ``sign_p`` is :func:`sign_test` on wins vs
    losses (ties dropped).
    """

    n: int
    mean_diff: float
    std: float | None
    win_rate: float
    wins: int
    losses: int
    ties: int
    sign_p: float

    def to_dict(self) -> dict:
        return asdict(self)


def paired_difference(diffs) -> PairedDifference:
    """Summarise a 1-D array of per-item differences; a difference of exactly 0 is a tie."""
    d = as_vector(diffs, "diffs").astype(np.float64)
    if d.size == 0:
        raise ValueError("diffs is empty")
    check_finite(d, "diffs")
    wins = int((d > 0).sum())
    losses = int((d < 0).sum())
    ties = int(d.size - wins - losses)
    return PairedDifference(
        n=int(d.size),
        mean_diff=float(d.mean()),
        std=float(d.std(ddof=1)) if d.size > 1 else None,
        win_rate=wins / d.size,
        wins=wins,
        losses=losses,
        ties=ties,
        sign_p=sign_test(wins, losses),
    )


def _item_means(values, name: str) -> np.ndarray:
    """1-D array -> itself; 2-D array -> row means; list of 1-D arrays -> their means."""
    if isinstance(values, np.ndarray) and values.ndim in (1, 2):
        arr = values.astype(np.float64)
        if arr.ndim == 2 and arr.shape[1] == 0:
            raise ValueError(f"{name} has items with no values")
        check_finite(arr, name)
        return arr if arr.ndim == 1 else arr.mean(axis=1)
    if isinstance(values, np.ndarray):
        raise ValueError(f"{name} must be 1-D, 2-D or a list of 1-D arrays, got shape {values.shape}")
    means = []
    for i, item in enumerate(values):
        a = np.asarray(item, dtype=np.float64).reshape(-1)
        if a.size == 0:
            raise ValueError(f"{name}: item {i} has no values")
        check_finite(a, f"{name} item {i}")
        means.append(a.mean())
    return np.asarray(means, dtype=np.float64)


def compositionality_summary(paraphrase_cos, negative_cos) -> dict:
    """Paraphrase-vs-negative cosine gap per item, and its summary.

    ``paraphrase_cos``: per item, the cosines of the anchor with its
    paraphrases -- a list of 1-D arrays (any count per item), a 2-D array
    ``[n_items, n_paraphrases]`` or a 1-D array (one paraphrase each).
    ``negative_cos``: the anchor's cosine with its negative, ``[n_items]``
    (a 2-D array or list is averaged per item the same way).

    Per item ``diff = mean(paraphrase cosines) - negative cosine``. Returns
    ``n_items, mean_diff, std (ddof=1, None for one item), win_rate (share
    diff > 0), wins, losses, ties, sign_p, mean_paraphrase, mean_negative,
    per_item_diffs`` (a list of floats).
    """
    para = _item_means(paraphrase_cos, "paraphrase_cos")
    neg = _item_means(negative_cos, "negative_cos")
    if para.shape[0] != neg.shape[0]:
        raise ValueError(
            f"paraphrase_cos has {para.shape[0]} items but negative_cos has {neg.shape[0]}"
        )
    if para.shape[0] == 0:
        raise ValueError("no items")
    diffs = para - neg
    summary = paired_difference(diffs)
    return {
        "n_items": summary.n,
        "mean_diff": summary.mean_diff,
        "std": summary.std,
        "win_rate": summary.win_rate,
        "wins": summary.wins,
        "losses": summary.losses,
        "ties": summary.ties,
        "sign_p": summary.sign_p,
        "mean_paraphrase": float(para.mean()),
        "mean_negative": float(neg.mean()),
        "per_item_diffs": [float(v) for v in diffs],
    }

