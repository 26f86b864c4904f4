"""Effect sizes and PCA."""

from __future__ import annotations

import math

import numpy as np

from layerscope.metrics.checks import as_matrix, as_vector, check_finite, row_blocks
from layerscope.metrics.vectors import centered_gram_features, column_means



def cohens_d(a, b) -> float:
    """Cohen's d = (mean(a) - mean(b)) / pooled std (sample variances, ddof=1).

    ``pooled = sqrt(((na-1) var_a + (nb-1) var_b) / (na + nb - 2))``; needs
    na + nb >= 3. Raises ``ValueError`` when the pooled std is 0.
    """
    A = as_vector(a, "a").astype(np.float64)
    B = as_vector(b, "b").astype(np.float64)
    if A.size < 1 or B.size < 1 or A.size + B.size < 3:
        raise ValueError(f"cohens_d needs both samples non-empty and >= 3 values in all, got {A.size} and {B.size}")
    check_finite(A, "a")
    check_finite(B, "b")
    ss = ((A - A.mean()) ** 2).sum() + ((B - B.mean()) ** 2).sum()
    pooled = math.sqrt(ss / (A.size + B.size - 2))
    if pooled == 0:
        raise ValueError("both samples are constant (pooled std is 0), so Cohen's d is undefined")
    return float((A.mean() - B.mean()) / pooled)


def pca_summary(x, *, n_components: int = 10) -> dict:
    """PCA by SVD of the column-centred data (float64).

    Returns ``mean [d]``, ``components [k, d]`` (unit rows; each flipped so
    its largest-magnitude loading is positive), ``explained_variance [k]``
    (ddof=1), ``explained_variance_ratio [k]`` (share of the total variance),
    ``singular_values [k]``, ``projections [n, k]``, ``n_components`` (k =
    min(n_components, n, d)) and ``total_variance``. Cost: one thin SVD of
    the ``[n, d]`` array; for tall data (n > 2d) the same decomposition is
    taken from the d x d scatter matrix ``Xc^T Xc`` (eigenvalues = squared
    singular values), which is several times faster.
    """
    X = as_matrix(x, "x")
    n, d = X.shape
    if n < 2:
        raise ValueError(f"PCA needs at least 2 rows, got {n}")
    if n_components < 1:
        raise ValueError(f"n_components must be >= 1, got {n_components}")
    check_finite(X, "x")
    mean = column_means(X)
    if n > 2 * d:
        evals, evecs = np.linalg.eigh(centered_gram_features(X, mean))
        evals, evecs = evals[::-1], evecs[:, ::-1]
        sv = np.sqrt(np.clip(evals, 0.0, None))
        vt = evecs.T
    else:
        _, sv, vt = np.linalg.svd(X.astype(np.float64) - mean, full_matrices=False)
    return _pca_result(X, mean, sv, vt, int(n_components))


def _pca_result(X: np.ndarray, mean: np.ndarray, sv: np.ndarray, vt: np.ndarray, n_components: int) -> dict:
    n = X.shape[0]
    k = min(n_components, sv.shape[0])
    comps = vt[:k]
    signs = np.sign(comps[np.arange(k), np.abs(comps).argmax(axis=1)])
    signs[signs == 0] = 1.0
    comps = comps * signs[:, None]
    var_all = sv ** 2 / (n - 1)
    total = float(var_all.sum())
    ratios = var_all[:k] / total if total > 0 else np.zeros(k)
    projections = np.vstack(
        [(X[b].astype(np.float64) - mean) @ comps.T for b in row_blocks(n, X.shape[1])]
    )
    return {
        "mean": mean,
        "components": comps,
        "explained_variance": var_all[:k],
        "explained_variance_ratio": ratios,
        "singular_values": sv[:k],
        "projections": projections,
        "n_components": k,
        "total_variance": total,
    }


