"""Input checks and row-block iteration shared by every metric module."""

from __future__ import annotations

import numpy as np

# Row-block sizes: how many array elements one temporary may hold.
BLOCK_ELEMENTS = 1 << 22  # ~4M elements (32 MiB in float64)



def _count_nonfinite(a: np.ndarray) -> tuple[int, int]:
    if not np.issubdtype(a.dtype, np.floating):
        return 0, 0
    n_nan = int(np.isnan(a).sum())
    n_inf = int(np.isinf(a).sum())
    return n_nan, n_inf


def check_finite(a: np.ndarray, name: str) -> None:
    n_nan, n_inf = _count_nonfinite(a)
    if n_nan or n_inf:
        parts = []
        if n_nan:
            parts.append(f"{n_nan} NaN value{'s' if n_nan != 1 else ''}")
        if n_inf:
            parts.append(f"{n_inf} infinite value{'s' if n_inf != 1 else ''}")
        raise ValueError(
            f"{name} has {' and '.join(parts)} (of {a.size}); drop or fill them first"
        )


def _as_numeric(a, name: str, ndim: int, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {what}, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}")
    return arr


def as_vector(a, name: str) -> np.ndarray:
    return _as_numeric(a, name, 1, "1-D")


def as_matrix(a, name: str) -> np.ndarray:
    return _as_numeric(a, name, 2, "2-D [n, d]")


def float_dtype(*arrays: np.ndarray) -> type:
    """float32 when every input is float32 (keep stores small), else float64."""
    if all(a.dtype == np.float32 for a in arrays):
        return np.float32
    return np.float64


def row_blocks(n: int, width: int, budget: int = BLOCK_ELEMENTS):
    step = max(1, budget // max(1, width))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))

