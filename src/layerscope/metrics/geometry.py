"""Geometry of one layer's vectors: intrinsic dimension, anisotropy, effective rank and matrix entropy.

Intrinsic dimension from nearest-neighbour distance ratios (points are rows, Euclidean distances):

* ``twonn``: TwoNN (Facco et al. 2017). ``mu = r2 / r1`` (second over first neighbour distance) follows a
  Pareto law ``F(mu) = 1 - mu^-d`` on a locally uniform manifold of dimension d; d is the slope, through the
  origin, of ``-log(1 - F_emp)`` against ``log mu`` over the smallest ``1 - discard_fraction`` of the ratios
  (``F_emp(i) = i / N``), as scikit-dimension's ``TwoNN`` (linear) fits it. Points at distance 0 from their
  nearest neighbour (duplicates) are dropped first.
* ``gride``: GRIDE (Denti et al. 2022). ``mu = r_{n2} / r_{n1}`` has the density
  ``d (mu^d - 1)^(n2-n1-1) / (B(n2-n1, n1) mu^((n2-1) d + 1))``; d is the root of the score of that likelihood,
  with DADApy's conventions: ``(N - 1) log d`` in place of ``N log d`` (unbiased at n1 = 1, where it is the
  TwoNN maximum likelihood ``(N - 1) / sum log mu``), and ratios at or above ``q50 + 20 (q95 - q50)`` left out
  as overlapping points. Its error is ``1 / sqrt`` of the observed information. ``n1`` sets the scale: larger
  n1 reads the data at a larger radius, less moved by noise at the smallest distances.

Known biases (said beside every figure): both underestimate a dimension that is large against ``log N`` (too
few points to see it), overestimate under noise at the scale they read (TwoNN reads the smallest one), and read
a curved or unevenly dense set at their own scale only; the estimators commonly used misread the true
dimension of data with several scales (Schulte & Rugamer 2026).

Anisotropy (Ethayarajh 2019): the mean cosine over every pair of vectors from different groups (texts), what
random pairs estimate, computed exactly from each group's sum of unit vectors:
``(|S|^2 - sum_g |S_g|^2) / (N^2 - sum_g n_g^2)``; ``centered``: the same after subtracting the vectors'
mean, which removes the common direction that makes raw cosines high.

Per prompt (a ``[tokens, hidden]`` matrix Z; Skean et al. 2025): the matrix entropy of its Gram matrix
``K = Z Z^T``, ``S_alpha = log(sum_i (lambda_i / tr K)^alpha) / (1 - alpha)`` (alpha = 1: the Shannon entropy
of the normalised eigenvalues), in nats, at most ``log(tokens)``; the effective rank (Roy & Vetterli 2007),
``exp(H(p))`` with ``p = sigma / sum sigma`` of Z's singular values, between 1 and ``min(tokens, hidden)``.
Neither is centred: a common direction (anisotropy) lowers both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from layerscope.metrics.checks import as_matrix, check_finite, row_blocks


def neighbor_distances(x, k: int) -> np.ndarray:
    """float64 ``[n, k]``: each row's Euclidean distances to its k nearest other rows, ascending.

    From ``|a|^2 + |b|^2 - 2 a.b`` in row blocks (never an ``n x n`` matrix whole); a pair that form cancels
    to nearly nothing (duplicates, near duplicates) is measured again from its difference, so a duplicate's
    distance is 0 exactly."""
    X = as_matrix(x, "x")
    check_finite(X, "x")
    X = X.astype(np.float64)
    n = len(X)
    if k < 1 or k > n - 1:
        raise ValueError(f"{k} neighbours need at least {k + 1} points, got {n}")
    sq = np.einsum("ij,ij->i", X, X)
    out = np.empty((n, k))
    for s in row_blocks(n, n):
        block = sq[s, None] + sq[None, :] - 2.0 * (X[s] @ X.T)
        near = np.nonzero(block <= 1e-6 * (sq[s, None] + sq[None, :]))
        rows = near[0] + s.start
        block[near] = np.einsum("ij,ij->i", X[rows] - X[near[1]], X[rows] - X[near[1]])
        block[np.arange(block.shape[0]), np.arange(s.start, s.stop)] = np.inf  # a row is not its own neighbour
        part = np.partition(block, k - 1, axis=1)[:, :k]
        out[s] = np.sqrt(np.maximum(np.sort(part, axis=1), 0.0))
    return out


def twonn_from_neighbors(r1: np.ndarray, r2: np.ndarray, discard_fraction: float = 0.1) -> float:
    """TwoNN from each point's first and second neighbour distances (see the module text)."""
    if not 0.0 < discard_fraction < 1.0:  # the largest ratio has F_emp = 1: -log(1 - F) is infinite
        raise ValueError(f"discard_fraction must be in (0, 1), got {discard_fraction}")
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = np.asarray(r2, np.float64) / np.asarray(r1, np.float64)
    mu = mu[np.isfinite(mu)]
    n = len(mu)
    keep = min(int(n * (1.0 - discard_fraction)), n - 1)
    if keep < 2:
        raise ValueError(f"TwoNN needs at least 2 distinct points left after discarding, got {keep}")
    x = np.log(np.sort(mu)[:keep])
    y = -np.log(1.0 - np.arange(1, keep + 1) / n)
    den = float(x @ x)
    if den <= 0.0:
        raise ValueError("TwoNN is undefined: every kept distance ratio is 1 (tied neighbours)")
    return float(x @ y) / den


def twonn(x, *, discard_fraction: float = 0.1) -> float:
    """TwoNN intrinsic dimension of the rows of ``x``."""
    nn = neighbor_distances(x, 2)
    return twonn_from_neighbors(nn[:, 0], nn[:, 1], discard_fraction)


@dataclass(frozen=True)
class Gride:
    dimension: float
    error: float  # 1 / sqrt(observed information)
    n1: int
    n2: int
    points: int  # ratios kept after the outlier cut


def gride_from_neighbors(r_n1: np.ndarray, r_n2: np.ndarray, n1: int, n2: int) -> Gride:
    """GRIDE from each point's n1-th and n2-th neighbour distances (see the module text)."""
    from scipy.optimize import brentq

    if not (isinstance(n1, (int, np.integer)) and isinstance(n2, (int, np.integer)) and 1 <= n1 < n2):
        raise ValueError(f"GRIDE needs integers 1 <= n1 < n2, got n1={n1}, n2={n2}")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_mu = np.log(np.asarray(r_n2, np.float64) / np.asarray(r_n1, np.float64))
    log_mu = log_mu[np.isfinite(log_mu) & (log_mu > 0)]  # duplicates and tied neighbours say nothing of d
    if len(log_mu) < 2:
        raise ValueError(f"GRIDE needs at least 2 points with distinct neighbour distances, got {len(log_mu)}")
    mu = np.exp(log_mu)
    q95, q50 = np.percentile(mu, [95, 50])
    log_mu = log_mu[mu < q50 + 20.0 * (q95 - q50)]
    n = len(log_mu)
    if n < 2:
        raise ValueError("GRIDE needs at least 2 points left after the outlier cut")
    total = float(log_mu.sum())

    def score(d: float) -> float:  # d log L / d d
        return (n - 1) / d + (n2 - n1 - 1) * float(np.sum(log_mu / -np.expm1(-d * log_mu))) - (n2 - 1) * total

    hi = 1.0
    while score(hi) > 0:  # the score falls from +inf to -n1 * sum(log mu): one root
        hi *= 2.0
    d = float(brentq(score, 1e-9, hi, xtol=1e-12, rtol=1e-12))
    info = n / d ** 2 + (n2 - n1 - 1) * float(np.sum((log_mu / (2.0 * np.sinh(d * log_mu / 2.0))) ** 2))
    return Gride(d, 1.0 / math.sqrt(info), int(n1), int(n2), n)


def gride(x, n1: int = 1, n2: int | None = None) -> Gride:
    """GRIDE intrinsic dimension of the rows of ``x`` at the scale ``(n1, n2)`` (default ``n2 = 2 n1``)."""
    n2 = 2 * n1 if n2 is None else n2
    nn = neighbor_distances(x, n2)
    return gride_from_neighbors(nn[:, n1 - 1], nn[:, n2 - 1], n1, n2)


# ---------------------------------------------------------------- anisotropy

def unit_sums(x, groups, *, center: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per group (``groups``: an integer label per row, 0..G-1), the sum of its rows' unit vectors
    (float64 ``[G, d]``) and its number of rows (``[G]``); rows of norm 0 are left out. ``center``: the
    rows' mean is subtracted first."""
    X = as_matrix(x, "x").astype(np.float64)
    check_finite(X, "x")
    g = np.asarray(groups, dtype=np.int64)
    if g.shape != (len(X),):
        raise ValueError(f"groups must hold one label per row ({len(X)}), got shape {g.shape}")
    if center:
        X = X - X.mean(axis=0)
    norms = np.linalg.norm(X, axis=1)
    keep = norms > 0
    count = int(g.max()) + 1 if len(g) else 0
    sums = np.zeros((count, X.shape[1]))
    np.add.at(sums, g[keep], X[keep] / norms[keep, None])
    return sums, np.bincount(g[keep], minlength=count).astype(np.float64)


def cross_group_cosine(sums: np.ndarray, counts: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The mean cosine over ordered pairs of rows from different groups, from ``unit_sums``; ``weights`` (how
    many times each group is counted, e.g. a bootstrap resample) default to 1: a pair of groups g, h counts
    ``w_g w_h`` times, and copies of one group never pair with each other (their tokens are the same
    tokens). Raises ``ValueError`` when no such pair exists."""
    w = np.ones(len(counts)) if weights is None else np.asarray(weights, np.float64)
    total = w @ sums
    pairs = (w @ counts) ** 2 - float((w ** 2) @ (counts ** 2))
    if pairs <= 0:
        raise ValueError("anisotropy needs rows from at least two groups (texts)")
    within = float((w ** 2) @ np.einsum("ij,ij->i", sums, sums))
    return (float(total @ total) - within) / pairs


def anisotropy(x, groups, *, center: bool = False) -> float:
    """The mean cosine between rows of different groups (see the module text)."""
    return cross_group_cosine(*unit_sums(x, groups, center=center))


# ---------------------------------------------------------------- per prompt

def gram_eigenvalues(z) -> np.ndarray:
    """The eigenvalues of ``Z Z^T`` (the squared singular values of Z), descending, float64."""
    Z = as_matrix(z, "z").astype(np.float64)
    check_finite(Z, "z")
    return np.linalg.svd(Z, compute_uv=False) ** 2


def matrix_entropy(z, alpha: float = 1.0) -> float:
    """The alpha-order matrix entropy of the Gram matrix of ``z``'s rows, in nats (see the module text)."""
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    lam = gram_eigenvalues(z)
    trace = float(lam.sum())
    if trace <= 0:
        raise ValueError("matrix entropy is undefined for a matrix of zeros")
    p = lam[lam > 0] / trace
    if abs(alpha - 1.0) < 1e-12:
        return float(-np.sum(p * np.log(p)))
    return float(np.log(np.sum(p ** alpha)) / (1.0 - alpha))


def effective_rank(z) -> float:
    """Roy & Vetterli's effective rank of ``z``: exp of the entropy of its L1-normalised singular values."""
    Z = as_matrix(z, "z").astype(np.float64)
    check_finite(Z, "z")
    s = np.linalg.svd(Z, compute_uv=False)
    total = float(s.sum())
    if total <= 0:
        raise ValueError("effective rank is undefined for a matrix of zeros")
    p = s[s > 0] / total
    return float(np.exp(-np.sum(p * np.log(p))))
