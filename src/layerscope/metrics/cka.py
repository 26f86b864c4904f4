"""CKA: linear CKA (in memory and streamed over row blocks) and the unbiased estimator."""

from __future__ import annotations

import math

import numpy as np

from layerscope.metrics.checks import as_matrix, check_finite, row_blocks
from layerscope.metrics.vectors import column_means

# linear_cka uses the n x n Gram form only when n is this small and below d.
_CKA_GRAM_MAX_N = 2048



def _cka_from_moments(cxx: np.ndarray, cyy: np.ndarray, cyx: np.ndarray) -> float:
    num = float(np.sum(cyx * cyx))
    den = float(np.linalg.norm(cxx) * np.linalg.norm(cyy))
    return float(np.clip(num / den, 0.0, 1.0))


def _no_variance_error(name: str, n: int) -> ValueError:
    return ValueError(
        f"{name} has no variance: all {n} rows are identical, so CKA is undefined"
    )


def _check_cka_pair(x, y) -> tuple[np.ndarray, np.ndarray]:
    X = as_matrix(x, "x")
    Y = as_matrix(y, "y")
    if X.shape[0] != Y.shape[0]:
        raise ValueError(f"x and y must have the same number of rows, got {X.shape[0]} and {Y.shape[0]}")
    check_finite(X, "x")
    check_finite(Y, "y")
    for arr, name in ((X, "x"), (Y, "y")):
        if arr.shape[0] >= 1 and np.all(arr == arr[0]):
            raise _no_variance_error(name, arr.shape[0])
    return X, Y


class LinearCKAAccumulator:
    """Linear CKA over row blocks, for stores that do not fit in memory.

    ``update(x_block, y_block)`` (rows are the same items in both spaces) any
    number of times, then ``result()``: equal to :func:`linear_cka` on the
    concatenated blocks. Keeps ``X^T X``, ``Y^T Y``, ``Y^T X``, column sums
    and n in float64, O(d^2) memory. For numerical stability the rows are
    shifted by the first block's column means before accumulating.
    """

    def __init__(self) -> None:
        self.n = 0
        self._shift_x: np.ndarray | None = None
        self._shift_y: np.ndarray | None = None
        self._first_x: np.ndarray | None = None
        self._first_y: np.ndarray | None = None
        self._x_varies = False
        self._y_varies = False

    def _start(self, shift_x: np.ndarray, shift_y: np.ndarray, first_x, first_y) -> None:
        dx, dy = shift_x.shape[0], shift_y.shape[0]
        self._shift_x, self._shift_y = shift_x, shift_y
        self._first_x, self._first_y = first_x, first_y
        self._sx = np.zeros(dx)
        self._sy = np.zeros(dy)
        self._xx = np.zeros((dx, dx))
        self._yy = np.zeros((dy, dy))
        self._yx = np.zeros((dy, dx))

    def update(self, x_block, y_block) -> "LinearCKAAccumulator":
        X = as_matrix(x_block, "x_block")
        Y = as_matrix(y_block, "y_block")
        if X.shape[0] != Y.shape[0]:
            raise ValueError(
                f"x_block and y_block must have the same number of rows, got {X.shape[0]} and {Y.shape[0]}"
            )
        if X.shape[0] == 0:
            return self
        check_finite(X, "x_block")
        check_finite(Y, "y_block")
        if self._shift_x is None:
            self._start(
                X.mean(axis=0, dtype=np.float64), Y.mean(axis=0, dtype=np.float64),
                X[0].copy(), Y[0].copy(),
            )
        elif X.shape[1] != self._shift_x.shape[0] or Y.shape[1] != self._shift_y.shape[0]:
            raise ValueError(
                f"block widths changed: expected x {self._shift_x.shape[0]} and y "
                f"{self._shift_y.shape[0]} columns, got {X.shape[1]} and {Y.shape[1]}"
            )
        self._x_varies = self._x_varies or bool(np.any(X != self._first_x))
        self._y_varies = self._y_varies or bool(np.any(Y != self._first_y))
        for s in row_blocks(X.shape[0], max(X.shape[1], Y.shape[1])):
            xs = X[s].astype(np.float64) - self._shift_x
            ys = Y[s].astype(np.float64) - self._shift_y
            self._sx += xs.sum(axis=0)
            self._sy += ys.sum(axis=0)
            self._xx += xs.T @ xs
            self._yy += ys.T @ ys
            self._yx += ys.T @ xs
        self.n += X.shape[0]
        return self

    def result(self) -> float:
        if self.n < 2:
            raise ValueError(f"CKA needs at least 2 rows, got {self.n}")
        if not self._x_varies:
            raise _no_variance_error("x", self.n)
        if not self._y_varies:
            raise _no_variance_error("y", self.n)
        mx = self._sx / self.n
        my = self._sy / self.n
        cxx = self._xx - self.n * np.outer(mx, mx)
        cyy = self._yy - self.n * np.outer(my, my)
        cyx = self._yx - self.n * np.outer(my, mx)
        return _cka_from_moments(cxx, cyy, cyx)


def _linear_cka_features(X: np.ndarray, Y: np.ndarray) -> float:
    """Feature-space form ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F), O(n d^2)."""
    acc = LinearCKAAccumulator()
    # Shift by the exact column means: the accumulated moments are then centred.
    acc._start(column_means(X), column_means(Y), X[0].copy(), Y[0].copy())
    return acc.update(X, Y).result()


def _linear_cka_gram(X: np.ndarray, Y: np.ndarray) -> float:
    """Gram form <Kc, Lc>_F / (||Kc||_F ||Lc||_F) with Kc = Xc Xc^T, O(n^2 d)."""
    Xc = X.astype(np.float64) - column_means(X)
    Yc = Y.astype(np.float64) - column_means(Y)
    K = Xc @ Xc.T
    L = Yc @ Yc.T
    num = float(np.sum(K * L))
    den = float(np.linalg.norm(K) * np.linalg.norm(L))
    return float(np.clip(num / den, 0.0, 1.0))


def linear_cka(x, y) -> float:
    """Linear CKA (Kornblith et al. 2019) of two representations of the same n items.

    Features are centred; the value is
    ``||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)``, computed in feature space,
    O(n d^2) time and O(d^2) memory (the equal n x n Gram form is used only
    when n <= 2048 and n is below the width). 1 for ``x`` vs ``x @ Q * c``
    (Q orthogonal); for one feature each it is Pearson r squared. Raises
    ``ValueError`` when a side has identical rows (no variance).
    """
    X, Y = _check_cka_pair(x, y)
    n = X.shape[0]
    if n < 2:
        raise ValueError(f"CKA needs at least 2 rows, got {n}")
    if n <= _CKA_GRAM_MAX_N and n < max(X.shape[1], Y.shape[1]):
        return _linear_cka_gram(X, Y)
    return _linear_cka_features(X, Y)


def _hsic_parts(X: np.ndarray, Y: np.ndarray):
    """Moments for the debiased HSIC of centred linear kernels, in row blocks."""
    mx, my = column_means(X), column_means(Y)
    dx, dy = X.shape[1], Y.shape[1]
    xx = np.zeros((dx, dx))
    yy = np.zeros((dy, dy))
    yx = np.zeros((dy, dx))
    kd_sum = ld_sum = kk_diag = ll_diag = kl_diag = 0.0
    for s in row_blocks(X.shape[0], max(dx, dy)):
        xs = X[s].astype(np.float64) - mx
        ys = Y[s].astype(np.float64) - my
        xx += xs.T @ xs
        yy += ys.T @ ys
        yx += ys.T @ xs
        kd = np.einsum("ij,ij->i", xs, xs)  # K_ii
        ld = np.einsum("ij,ij->i", ys, ys)  # L_ii
        kd_sum += kd.sum()
        ld_sum += ld.sum()
        kk_diag += kd @ kd
        ll_diag += ld @ ld
        kl_diag += kd @ ld
    return xx, yy, yx, kd_sum, ld_sum, kk_diag, ll_diag, kl_diag


def _hsic1(tr_kl: float, diag_kl: float, k_sum_diag: float, l_sum_diag: float, n: int) -> float:
    """Song et al. (2012) unbiased HSIC for centred features (sum of rows = 0).

    With K~, L~ the Gram matrices with zeroed diagonals:
    ``tr(K~L~) = tr(KL) - sum_i K_ii L_ii``, ``1^T K~ 1 = -sum_i K_ii`` and
    ``1^T K~ L~ 1 = sum_i K_ii L_ii`` (since ``(K~ 1)_i = -K_ii``), and
    ``HSIC_1 = [tr(K~L~) + (1^T K~ 1)(1^T L~ 1)/((n-1)(n-2))
               - 2/(n-2) 1^T K~ L~ 1] / (n(n-3))``.
    """
    t = tr_kl - diag_kl
    return (t + k_sum_diag * l_sum_diag / ((n - 1) * (n - 2)) - 2.0 * diag_kl / (n - 2)) / (n * (n - 3))


def unbiased_cka(x, y) -> float:
    """Debiased linear CKA: the unbiased HSIC estimator of Song et al. (2012),
    as used for CKA by Nguyen et al. (2020), normalised like CKA.

    ``HSIC_1(K, L) / sqrt(HSIC_1(K, K) HSIC_1(L, L))`` with linear kernels on
    centred features (the estimator is unchanged by shifting the features).
    Written out directly it is O(n^2) in time and memory; here every term is
    reduced to feature-space moments, so it runs in O(n d^2) time and O(d^2)
    memory without an n x n matrix. Needs n > 3. Can be slightly negative
    for unrelated data. Raises ``ValueError`` when a self-HSIC is not
    positive (no usable variance).
    """
    X, Y = _check_cka_pair(x, y)
    n = X.shape[0]
    if n <= 3:
        raise ValueError(f"the unbiased CKA estimator needs n > 3 rows, got {n}")
    xx, yy, yx, kd, ld, kk, ll, kl = _hsic_parts(X, Y)
    h_xy = _hsic1(float(np.sum(yx * yx)), kl, -kd, -ld, n)
    h_xx = _hsic1(float(np.sum(xx * xx)), kk, -kd, -kd, n)
    h_yy = _hsic1(float(np.sum(yy * yy)), ll, -ld, -ld, n)
    if h_xx <= 0 or h_yy <= 0:
        raise ValueError(
            "the unbiased self-similarity (HSIC) of x or y is not positive for these "
            f"{n} rows, so unbiased CKA is undefined; use more rows or linear_cka"
        )
    return float(h_xy / math.sqrt(h_xx * h_yy))

