"""Matched vs scrambled pairs: how far the matched mean cosine stands above chance."""

from __future__ import annotations

import itertools
import math

import numpy as np

from layerscope.metrics.checks import BLOCK_ELEMENTS, as_matrix, check_finite, float_dtype
from layerscope.metrics.vectors import centered_gram_features, column_means, l2_normalize, paired_cosine

# scrambled_z uses an n x n cosine matrix only up to this n (32 MiB float64).
_GRAM_MAX_N = 2048
# A scrambled std at or below this counts as zero (z undefined).
_STD_ZERO = 1e-12
_MAX_EXHAUSTIVE_N = 8


def _unit_pair(src, tgt) -> tuple[np.ndarray, np.ndarray]:
    S = as_matrix(src, "src")
    T = as_matrix(tgt, "tgt")
    if S.shape != T.shape:
        raise ValueError(f"src and tgt must have the same shape, got {S.shape} and {T.shape}")
    if S.shape[0] < 2:
        raise ValueError(f"scrambling needs at least 2 pairs, got {S.shape[0]}")
    check_finite(S, "src")
    check_finite(T, "tgt")
    dtype = float_dtype(S, T)
    return l2_normalize(S.astype(dtype, copy=False)), l2_normalize(T.astype(dtype, copy=False))


def _scrambled_means_gram(G: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """Mean of G[i, perm(i)] for each permutation row (G = S T^T, n small)."""
    n = G.shape[0]
    return G[np.arange(n)[None, :], perms].mean(axis=1)


def _scrambled_means_direct(S: np.ndarray, T: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """Same as the Gram form without any n x n array: O(n*d) per permutation.

    Permutations are processed in blocks and rows in chunks so one gathered
    temporary holds at most ``BLOCK_ELEMENTS`` elements.
    """
    n_perm, n = perms.shape
    d = S.shape[1]
    rows = min(n, max(1, BLOCK_ELEMENTS // max(1, d)))
    pblock = max(1, BLOCK_ELEMENTS // (rows * max(1, d)))
    sums = np.zeros(n_perm, dtype=np.float64)
    for p0 in range(0, n_perm, pblock):
        P = perms[p0:p0 + pblock]
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            gathered = T[P[:, r0:r1]]  # [b, rows, d]
            dots = np.einsum("brd,rd->br", gathered, S[r0:r1])
            sums[p0:p0 + P.shape[0]] += dots.sum(axis=1, dtype=np.float64)
    return sums / n


def monte_carlo_z_se(z: float | None, values: np.ndarray) -> float | None:
    """Standard error of a Monte Carlo z from the ``B`` sampled scrambled means ``values`` (delta method).

    ``z = (m - mean) / std`` with ``mean`` and ``std`` estimated from the sample; to first order
    ``Var(z) = (1 + z g + z^2 (k - 1) / 4) / B`` with ``g`` and ``k`` the skewness and kurtosis of the
    scrambled means (for a normal sample ``(1 + z^2 / 2) / B``): at z = 28 and B = 1,000, about 0.63.
    """
    if z is None:
        return None
    v = np.asarray(values, dtype=np.float64)
    c = v - v.mean()
    m2 = float(np.mean(c * c))
    if m2 <= 0.0:
        return None
    g = float(np.mean(c ** 3)) / m2 ** 1.5
    k = float(np.mean(c ** 4)) / m2 ** 2
    return math.sqrt(max(1.0 + z * g + z * z * (k - 1.0) / 4.0, 0.0) / v.size)


def _z_result(matched, mean, std, n, n_perm, method) -> dict:
    undefined = None
    z = None
    if std <= _STD_ZERO:
        undefined = (
            "every scrambling of the targets gives the same mean cosine "
            "(scrambled std is 0), so the z-score is undefined"
        )
    else:
        z = (matched - mean) / std
    return {
        "matched": float(matched),
        "scrambled_mean": float(mean),
        "scrambled_std": float(std),
        "z": None if z is None else float(z),
        "n_perm": n_perm,
        "n": int(n),
        "method": method,
        "undefined": undefined,
    }


def scrambled_z(src, tgt, *, n_perm: int = 1000, seed: int = 0, exhaustive: bool = False) -> dict:
    """How far the matched pairs' mean cosine stands above scrambled pairs.

    Rows of ``src`` and ``tgt`` (``[n, d]``, row i of each is a matched pair)
    are unit-normalised. ``matched`` is the mean paired cosine. A scrambling
    is a uniformly random permutation ``p`` of the targets (all ``n!``
    permutations equally likely, fixed points allowed); its score is
    ``mean_i cos(src_i, tgt_p(i))``. Returns ``matched, scrambled_mean,
    scrambled_std, z = (matched - scrambled_mean) / scrambled_std, n_perm, n,
    method, undefined`` (``z`` is ``None`` with the reason when the std is 0).

    * Monte Carlo (default): ``n_perm`` permutations from
      ``np.random.default_rng(seed)``; std with ddof=1; ``z_se`` is the
      z's own Monte Carlo standard error (:func:`monte_carlo_z_se`).
    * ``exhaustive=True`` (n <= 8): every one of the ``n!`` permutations,
      population std (ddof=0) -- the exact permutation distribution.

    Never forms an n x n matrix for n > 2048: permuted paired cosines are
    computed directly, O(n*d) per permutation, vectorised over blocks of
    permutations. The exact moments in O(n*d^2) (:func:`scrambled_z_exact`) make the
    Monte Carlo estimate unnecessary wherever they can be computed.
    """
    S, T = _unit_pair(src, tgt)
    n = S.shape[0]
    matched = float(paired_cosine(S, T).mean())
    use_gram = n <= _GRAM_MAX_N
    G = S.astype(np.float64) @ T.astype(np.float64).T if use_gram else None

    def means_of(perms: np.ndarray) -> np.ndarray:
        if use_gram:
            return _scrambled_means_gram(G, perms)
        return _scrambled_means_direct(S, T, perms)

    if exhaustive:
        if n > _MAX_EXHAUSTIVE_N:
            raise ValueError(
                f"exhaustive=True enumerates all n! permutations and allows n <= "
                f"{_MAX_EXHAUSTIVE_N}, got n={n}; use the Monte Carlo default"
            )
        perms = np.array(list(itertools.permutations(range(n))), dtype=np.intp)
        vals = means_of(perms)
        return _z_result(matched, vals.mean(), vals.std(ddof=0), n, int(perms.shape[0]), "exhaustive")

    if n_perm < 2:
        raise ValueError(f"n_perm must be >= 2, got {n_perm}")
    rng = np.random.default_rng(seed)
    pblock = max(1, min(n_perm, BLOCK_ELEMENTS // n))
    vals = np.empty(n_perm, dtype=np.float64)
    base = np.arange(n, dtype=np.intp)
    for p0 in range(0, n_perm, pblock):
        b = min(pblock, n_perm - p0)
        perms = rng.permuted(np.tile(base, (b, 1)), axis=1)
        vals[p0:p0 + b] = means_of(perms)
    out = _z_result(matched, vals.mean(), vals.std(ddof=1), n, int(n_perm), "monte-carlo")
    out["z_se"] = monte_carlo_z_se(out["z"], vals)
    return out


def scrambled_z_exact(src, tgt) -> dict:
    """Exact mean and std of the scrambled mean cosine, without sampling.

    Same setting and return keys as :func:`scrambled_z` (``method="exact"``,
    ``n_perm=None``). For a uniform random permutation ``p`` and
    ``c_ij = s_i . t_j`` (unit rows):

    * ``E[mean_i c_i,p(i)] = (sum_i s_i) . (sum_j t_j) / n^2``
    * ``Var = sum_ij d_ij^2 / (n^2 (n - 1))`` (Hoeffding 1951), with
      ``d_ij = (s_i - s_bar) . (t_j - t_bar)``, and
      ``sum_ij d_ij^2 = <S_c^T S_c, T_c^T T_c>_F`` -- O(n d^2), no n x n matrix.
    """
    S, T = _unit_pair(src, tgt)
    n = S.shape[0]
    matched = float(paired_cosine(S, T).mean())
    ms = column_means(S)
    mt = column_means(T)
    mean = float(ms @ mt)  # (sum s)(sum t)/n^2
    ss = float(np.sum(centered_gram_features(S, ms) * centered_gram_features(T, mt)))
    var = max(ss, 0.0) / (n * n * (n - 1))
    return _z_result(matched, mean, math.sqrt(var), n, None, "exact")

