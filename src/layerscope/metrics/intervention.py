"""The arithmetic of interventions on hidden states (numpy only): patching's normalised effect, steering
vectors and their null, and what a next-token distribution says.

* ``normalised_effect``: how much of the way from the corrupted run's metric to the clean run's a patch
  restores, ``sum(patched - corrupted) / sum(clean - corrupted)`` over pairs (a ratio of means, so a pair whose
  clean and corrupted runs score alike adds little weight instead of dividing by almost nothing); 0 = the
  corrupted run, 1 = the clean run. ``effect_scorer`` is the same figure over resampled pair indices.
* steering vectors from contrastive pairs: ``mean_difference`` (the mean of positive - negative) and
  ``pca_direction`` (the first principal component of the pair differences, centred as sklearn's ``PCA``,
  signed along the mean difference and as long as the mean difference's projection on it);
  ``random_direction``: a Gaussian direction of a given norm (the null of equal size).
* distributions from logits: ``log_softmax`` (float64), ``logit_difference``, ``kl_divergence``.
"""

from __future__ import annotations

import numpy as np

from layerscope.metrics.checks import as_matrix, check_finite

# |sum(clean - corrupted)| below this leaves the normalised effect undefined (the pairs do not move the metric)
FLAT = 1e-9


def normalised_effect(patched, clean, corrupted) -> float | None:
    """``sum(patched - corrupted) / sum(clean - corrupted)`` over pairs; None where the denominator is ~0."""
    p, c, r = (np.asarray(x, dtype=np.float64) for x in (patched, clean, corrupted))
    if not (p.shape == c.shape == r.shape) or p.ndim != 1 or p.size == 0:
        raise ValueError(f"patched, clean and corrupted must be 1-D of one length, got {p.shape}, {c.shape}, {r.shape}")
    bottom = float(np.sum(c - r))
    if abs(bottom) <= FLAT * max(1.0, float(np.sum(np.abs(c - r)))):
        return None
    return float(np.sum(p - r) / bottom)


def effect_scorer(patched, clean, corrupted):
    """``normalised_effect`` of resampled pair indices (``idx`` ``[..., n]``), NaN where undefined."""
    p, c, r = (np.asarray(x, dtype=np.float64) for x in (patched, clean, corrupted))
    top_all, bottom_all = p - r, c - r
    spread = np.abs(bottom_all)

    def score(idx: np.ndarray) -> np.ndarray:
        top, bottom = top_all[idx].sum(axis=-1), bottom_all[idx].sum(axis=-1)
        flat = np.abs(bottom) <= FLAT * np.maximum(1.0, spread[idx].sum(axis=-1))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(flat, np.nan, top / np.where(flat, 1.0, bottom))

    return score


def mean_difference(positive, negative) -> np.ndarray:
    """The mean of ``positive - negative`` over paired rows (``[n, d]`` each): float64 ``[d]``."""
    pos, neg = as_matrix(positive, "positive").astype(np.float64), as_matrix(negative, "negative").astype(np.float64)
    if pos.shape != neg.shape or pos.shape[0] < 1:
        raise ValueError(f"positive and negative must be paired rows of one width, got {pos.shape} and {neg.shape}")
    check_finite(pos, "positive")
    check_finite(neg, "negative")
    return (pos - neg).mean(axis=0)


def pca_direction(positive, negative) -> np.ndarray:
    """The first principal component of the pair differences (centred), signed so it points along the mean
    difference, scaled to the mean difference's projection on it: float64 ``[d]`` (zeros where the differences
    do not vary, or the component is orthogonal to their mean)."""
    diffs = as_matrix(positive, "positive").astype(np.float64) - as_matrix(negative, "negative").astype(np.float64)
    mean = diffs.mean(axis=0)
    centred = diffs - mean
    if diffs.shape[0] < 2 or not np.any(centred):
        return np.zeros(diffs.shape[1])
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    unit = vt[0]
    along = float(unit @ mean)
    return unit * along


def random_direction(width: int, norm: float, rng: np.random.Generator) -> np.ndarray:
    """A direction drawn uniformly on the sphere (a normalised Gaussian), of length ``norm``: float64 ``[width]``."""
    v = rng.standard_normal(int(width))
    return v / np.linalg.norm(v) * float(norm)


def log_softmax(logits) -> np.ndarray:
    """log-probabilities over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    top = z.max(axis=-1, keepdims=True)
    return z - top - np.log(np.exp(z - top).sum(axis=-1, keepdims=True))


def logit_difference(logits, target, foil) -> np.ndarray:
    """``logits[..., target] - logits[..., foil]`` (per row where ``target``/``foil`` are arrays), float64."""
    z = np.asarray(logits, dtype=np.float64)
    t, f = np.asarray(target), np.asarray(foil)
    return np.take_along_axis(z, t[..., None], -1)[..., 0] - np.take_along_axis(z, f[..., None], -1)[..., 0] \
        if t.ndim else z[..., int(t)] - z[..., int(f)]


def kl_divergence(p_logits, q_logits) -> np.ndarray:
    """KL(p || q) in nats of the distributions whose logits are given (last axis), float64."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return np.sum(np.exp(lp) * (lp - lq), axis=-1)
