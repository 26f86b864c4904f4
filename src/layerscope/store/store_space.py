"""Disk space for a store's arrays, reserved up front.

Extraction writes into memory-mapped files; a page that cannot be backed by
disk space kills the process with SIGBUS, not an exception.  So the space is
checked and reserved (``posix_fallocate``) when the arrays are created: a disk
that is too small is one error before any work, naming the bytes needed and
free, and later writes land in blocks that already exist.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np

from layerscope.errors import StoreError

FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def _gb(n: int) -> str:
    return f"{n:,} bytes ({n / 1e9:.2f} GB)" if n >= 1e8 else f"{n:,} bytes"


def no_space(where: Path, needed: int, exc: OSError | None = None) -> StoreError:
    free = shutil.disk_usage(where).free
    cause = "the file-size limit (ulimit -f) is too small" if exc is not None and exc.errno == errno.EFBIG \
        else "not enough free space"
    return StoreError(f"{where}: {cause} for the store's arrays: they need {_gb(needed)}, "
                      f"{_gb(free)} are free; free some space or choose another --out")


def check_free(where: Path, needed: int) -> None:
    if needed > shutil.disk_usage(where).free:
        raise no_space(where, needed)


def allocate_npy(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    """Create a zero-filled ``.npy`` at ``path`` whose data blocks are reserved on disk."""
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    del arr
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        try:
            os.posix_fallocate(fh.fileno(), 0, size)
        except OSError as exc:
            if exc.errno not in _UNSUPPORTED:  # a filesystem without fallocate keeps the sparse file
                raise
