"""The store's ``.npy`` files at the level below the store: a header read alone, a file checked against the
shape and dtype the store says, the sha256 of the internal arrays a writer relies on, and the pages of a
flushed memmap handed back. Shared by the store, its checks, its ranges and its token arrays, so none of
them imports another for these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from layerscope.errors import StoreError
from layerscope.hashing import file_sha256


def npy_header(path: Path) -> tuple[tuple, np.dtype, bool, int]:
    """(shape, dtype, fortran_order, data offset) of a .npy file, from its header alone."""
    with open(path, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        return shape, dtype, fortran, fh.tell()


def check_npy(root: Path, rel: str, shape: tuple, dtype: np.dtype) -> str | None:
    """What is wrong with ``root/rel`` as a ``.npy`` of ``shape`` and ``dtype`` (None: nothing), read from its
    header and size alone."""
    path = root / rel
    if not path.is_file():
        return f"{rel} is missing"
    try:
        got_shape, got_dtype, fortran, offset = npy_header(path)
    except (ValueError, OSError, SyntaxError) as exc:
        return f"{rel} is not a valid .npy file ({exc})"
    if tuple(got_shape) != shape or got_dtype != dtype or fortran:
        return f"{rel} holds {got_dtype} {list(got_shape)}, the store says {dtype} {list(shape)}"
    want = offset + int(np.prod(shape)) * dtype.itemsize
    size = path.stat().st_size
    if size != want:
        return f"{rel} is {size:,} bytes, a {dtype} {list(shape)} array is {want:,} (truncated or padded)"
    return None


def internal_sha256(root: Path, rels: list[str]) -> dict[str, str]:
    """``{file: sha256}`` of files a writer relies on later (recorded in store.json as ``internal_sha256``)."""
    return {rel: file_sha256(Path(root) / rel) for rel in rels if (Path(root) / rel).is_file()}


def load_internal(root: Path, rel: str, recorded: Mapping[str, str], dtype: np.dtype, shape: tuple) -> np.ndarray:
    """An internal array of the store (``ray-offsets.npy``, ``lengths.npy``) that a writer relies on, checked
    before use: its header, its size, and its sha256 where store.json recorded one (``recorded``: the store's
    ``internal_sha256``). One line when damaged."""
    root = Path(root)
    problem = check_npy(root, rel, tuple(shape), np.dtype(dtype))
    if problem is None and rel in recorded and file_sha256(root / rel) != recorded[rel]:
        problem = f"{rel} does not match the sha256 recorded when the store was made (damaged or edited)"
    if problem is None:
        try:
            return np.load(root / rel, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            problem = f"{rel} cannot be read ({str(exc)[:120]})"
    raise StoreError(f"{root} is damaged: {problem}; it is internal to the store and cannot be trusted, so "
                     "nothing was written. Extract again into another --out, or delete this folder yourself first")


def release_pages(arr: np.ndarray) -> None:
    """madvise(DONTNEED) a flushed, shared, file-backed memmap (a no-op where unsupported)."""
    import mmap

    mm = getattr(arr, "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mm is None or advice is None or not hasattr(mm, "madvise"):
        return
    try:
        mm.madvise(advice)
    except (OSError, ValueError):
        pass
