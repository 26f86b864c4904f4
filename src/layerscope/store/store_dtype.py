"""How a store keeps its vectors on disk: float32, float16 or bfloat16, always read back as float32.

The store's ``dtype`` (``store.json``) names the storage type. float32 and float16 are plain ``.npy``
arrays of that type. NumPy has no bfloat16, so a bfloat16 array is a ``uint16`` ``.npy`` holding the
upper 16 bits of each float32 (rounded to nearest even by ``ml_dtypes``, the bfloat16 type that ONNX
itself depends on); ``decode`` turns it back into float32 exactly as a bfloat16 -> float32 cast does.

Every reader goes through ``decode`` and every writer through ``encode``; ``error_stats`` measures
what the half-size type lost against the float32 vectors it was made from (per-layer max absolute
error and min cosine, recorded in ``store.json``).
"""

from __future__ import annotations

import numpy as np

STORE_DTYPES = ("float32", "float16", "bfloat16")


def check(name: str) -> str:
    if name not in STORE_DTYPES:
        from layerscope.errors import InputError

        raise InputError(f"--store-dtype must be one of {', '.join(STORE_DTYPES)}, not {name!r}")
    return name


def disk_dtype(name: str) -> np.dtype:
    """The NumPy dtype of the ``.npy`` files of a store of storage type ``name``."""
    check(name)
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def itemsize(name: str) -> int:
    return disk_dtype(name).itemsize


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def encode(x: np.ndarray, name: str) -> np.ndarray:
    """float vectors -> the on-disk representation of storage type ``name``."""
    x = np.asarray(x, dtype=np.float32)
    if name == "float32":
        return x
    if name == "float16":
        return x.astype(np.float16)
    if name == "bfloat16":
        return x.astype(_bf16()).view(np.uint16)
    check(name)
    raise AssertionError("unreachable")


def decode(a: np.ndarray, name: str) -> np.ndarray:
    """On-disk array of storage type ``name`` -> float32 (a new array; the input may be a memmap)."""
    if name == "bfloat16":
        return np.asarray(a, dtype=np.uint16).view(_bf16()).astype(np.float32)
    check(name)
    return np.asarray(a).astype(np.float32, copy=True)


def error_stats(x: np.ndarray, name: str) -> tuple[float, float]:
    """(max |x - decode(encode(x))|, min row cosine between them) for float32 rows ``x`` [n, hidden].

    Rows that are all zeros in both keep cosine 1 (nothing was lost); a row that became zero from a
    non-zero one has cosine 0.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.size == 0:
        return 0.0, 1.0
    y = decode(encode(x, name), name)
    err = float(np.max(np.abs(x.astype(np.float64) - y)))
    x64, y64 = x.astype(np.float64).reshape(len(x), -1), y.astype(np.float64).reshape(len(y), -1)
    nx, ny = np.linalg.norm(x64, axis=1), np.linalg.norm(y64, axis=1)
    dot = np.sum(x64 * y64, axis=1)
    both_zero = (nx == 0) & (ny == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(both_zero, 1.0, dot / np.maximum(nx * ny, np.finfo(np.float64).tiny))
    return err, float(np.min(cos))


# The least cosine to the float32 vectors a half-size store may keep, per (pooling, layer). Measured on
# MiniLM over the 2,758 STS test sentences, every layer, mean and cls (benchmarks/scaleout/README.md):
# float16 loses at most 5.3e-8 of cosine, bfloat16 at most 2.9e-6 -- what rounding to 11 and 8
# significant bits predicts for any model ((2^-p)^2 / 6), since the loss is relative. The bars leave
# 190x (float16) and 35x (bfloat16) of room over that, and refuse what rounding alone cannot cause: float16
# overflow (an activation above 65504 becomes inf) or underflow of tiny rows, or a broken engine.
MIN_COSINE = {"float16": 0.99999, "bfloat16": 0.9999}


def check_error_bar(where, name: str, errors: dict) -> None:
    """Refuse (one line) a half-size store whose vectors lost more than ``MIN_COSINE`` allows on any layer.

    ``errors``: ``{"pooling/layer": HalfError}`` (``store_record``: max_abs_error, min_cosine)."""
    bar = MIN_COSINE.get(name)
    if bar is None:
        return
    bad = [(key, rec.min_cosine) for key, rec in errors.items()
           if not (float(rec.min_cosine) >= bar and np.isfinite(float(rec.max_abs_error)))]
    if bad:
        from layerscope.errors import StoreError

        key, cos = min(bad, key=lambda kv: float(kv[1]) if np.isfinite(float(kv[1])) else -2.0)
        raise StoreError(f"{where}: {name} keeps the vectors of {key} only to cosine {float(cos):.6f} of float32 "
                         f"(the bar is {bar}; {len(bad)} pooling/layer pairs fall below it); use --store-dtype "
                         "float32")
