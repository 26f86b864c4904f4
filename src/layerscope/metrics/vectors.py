"""Vectors: L2 normalisation, paired cosines and float64 column moments."""

from __future__ import annotations

import numpy as np

from layerscope.metrics.checks import as_matrix, row_blocks



def _row_norms(x: np.ndarray) -> np.ndarray:
    """float64 L2 norm of each row (last axis), accumulated blockwise."""
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    out = np.empty(x2.shape[0], dtype=np.float64)
    for s in row_blocks(x2.shape[0], x2.shape[1]):
        b = x2[s].astype(np.float64, copy=False)
        out[s] = np.sqrt(np.einsum("ij,ij->i", b, b))
    return out


def l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Scale each row (or a single 1-D vector) to unit L2 norm.

    Rows whose norm is at most ``eps`` are returned unchanged, so zero rows
    stay zero. Float inputs keep their dtype; others become float64.
    """
    arr = np.asarray(x)
    if arr.ndim not in (1, 2):
        raise ValueError(f"x must be 1-D or 2-D, got shape {arr.shape}")
    dtype = arr.dtype if np.issubdtype(arr.dtype, np.floating) else np.float64
    norms = _row_norms(arr)
    norms = np.where(norms > eps, norms, 1.0)
    if arr.ndim == 1:
        return (arr / norms[0]).astype(dtype, copy=False)
    return (arr / norms[:, None]).astype(dtype, copy=False)


def paired_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``a`` with row i of ``b``, float64, shape ``[n]``.

    Accumulated in float64; a pair with a zero vector gets 0.0.
    """
    A = as_matrix(a, "a")
    B = as_matrix(b, "b")
    if A.shape != B.shape:
        raise ValueError(f"a and b must have the same shape, got {A.shape} and {B.shape}")
    out = np.empty(A.shape[0], dtype=np.float64)
    for s in row_blocks(A.shape[0], A.shape[1]):
        a64 = A[s].astype(np.float64, copy=False)
        b64 = B[s].astype(np.float64, copy=False)
        dot = np.einsum("ij,ij->i", a64, b64)
        den = np.sqrt(np.einsum("ij,ij->i", a64, a64) * np.einsum("ij,ij->i", b64, b64))
        safe = den > 0
        out[s] = np.where(safe, dot / np.where(safe, den, 1.0), 0.0)
    return np.clip(out, -1.0, 1.0)



def layer_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-layer cosines of paired vectors: ``[layers, n, h]`` x2 -> ``[n, layers]`` (float64)."""
    return np.stack([paired_cosine(a[i], b[i]) for i in range(a.shape[0])], axis=1)


def centered_gram_features(X: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """(X - mean)^T (X - mean) in float64, accumulated over row blocks."""
    d = X.shape[1]
    out = np.zeros((d, d), dtype=np.float64)
    for s in row_blocks(X.shape[0], d):
        b = X[s].astype(np.float64) - mean
        out += b.T @ b
    return out


def column_means(X: np.ndarray) -> np.ndarray:
    total = np.zeros(X.shape[1], dtype=np.float64)
    for s in row_blocks(X.shape[0], X.shape[1]):
        total += X[s].sum(axis=0, dtype=np.float64)
    return total / X.shape[0]


