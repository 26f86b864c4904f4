"""The mutual k-NN of the platonic-representation paper, written out with NumPy alone (never layerscope's code),
for the tests that hold layerscope's cross-modal figures to it."""

from __future__ import annotations

import numpy as np


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Cosine kernels of both spaces, each item's k nearest others in each (ties to the lower index), the mean
    share of the k that both sides name."""
    def neighbours(z):
        u = z / np.linalg.norm(z, axis=1, keepdims=True)
        sim = u @ u.T
        np.fill_diagonal(sim, -np.inf)
        return [set(np.argsort(-sim[i], kind="stable")[:k]) for i in range(len(z))]

    nx, ny = neighbours(x), neighbours(y)
    return float(np.mean([len(nx[i] & ny[i]) / k for i in range(len(x))]))
