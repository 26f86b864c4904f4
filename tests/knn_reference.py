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


def relative_retrieval(x: np.ndarray, y: np.ndarray, acc_k: int, seed: int) -> tuple[float, float]:
    """Retrieval acc@k both ways (x -> y, y -> x) across two spaces through relative representations, counted
    one query at a time: the pairs split by the first permutation of NumPy's generator for ``seed`` into
    anchors (its first half) and queries (the rest); each query is its cosines to the anchors of its own
    space, centred and scaled to unit length; a query finds its pair when fewer than ``acc_k`` queries of the
    other space score strictly above it."""
    n = len(x)
    order = np.random.default_rng(seed).permutation(n)
    anchors, queries = sorted(order[: n // 2]), sorted(order[n // 2:])
    assert not set(anchors) & set(queries) and len(anchors) + len(queries) == n

    def profile(z, q):
        cos = [float(z[q] @ z[a] / (np.linalg.norm(z[q]) * np.linalg.norm(z[a]))) for a in anchors]
        centred = np.array(cos) - np.mean(cos)
        return centred / np.linalg.norm(centred)

    px = {q: profile(x, q) for q in queries}
    py = {q: profile(y, q) for q in queries}
    x_to_y = y_to_x = 0
    for q in queries:
        pair = px[q] @ py[q]
        x_to_y += sum(px[q] @ py[other] > pair for other in queries) < acc_k  # q's row: y's queries compete
        y_to_x += sum(px[other] @ py[q] > pair for other in queries) < acc_k  # q's column: x's queries compete
    return x_to_y / len(queries), y_to_x / len(queries)
