"""One writer per store: the output lock of ``layerscope/out_lock.py`` (an exclusive, non-blocking
``flock`` on ``<parent>/.<name>.lock`` beside the resolved store directory), raising store errors."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Iterator

from layerscope.errors import StoreError
from layerscope.out_lock import lock_path
from layerscope.out_lock import acquire as _acquire
from layerscope.out_lock import release as _release

__all__ = ["StoreLockedError", "acquire", "lock_path", "release", "store_lock"]


class StoreLockedError(StoreError):
    """Another process is writing this store right now."""


def acquire(store_dir: Path) -> int:
    """Take the lock; return its file descriptor.  Raise StoreError at once if another process holds it."""
    fd, _ = _acquire(Path(store_dir), error=StoreError, locked=StoreLockedError)
    return fd


def release(store_dir: Path, fd: int) -> None:
    """Unlink the lock file while still holding it, then drop the lock."""
    _release(lock_path(store_dir), fd)


@contextlib.contextmanager
def store_lock(store_dir: str | Path) -> Iterator[None]:
    """Hold the store's write lock for the duration of the ``with`` block."""
    fd, path = _acquire(Path(store_dir), error=StoreError, locked=StoreLockedError)
    try:
        yield
    finally:
        _release(path, fd)


@contextlib.contextmanager
def store_writer(store_dir: str | Path) -> Iterator[None]:
    """Hold the store's write lock, and keep the store's record of layerscope's files right however the
    writer ends: hashed again when it completes (a writer that continues a store marks its files as being
    rewritten first, ``ownership.rewriting``, so a run killed with SIGKILL leaves files ``--force`` knows).
    Only files named by the writers (``ownership.note``) and the range marks are recorded; a file a user
    puts into the folder meanwhile, or one that was not layerscope's when the writer started, never is."""
    from layerscope.ownership import foreign, not_layerscopes

    store_dir = Path(store_dir)
    with store_lock(store_dir):
        if store_dir.is_dir() and any(store_dir.iterdir()) and foreign(store_dir) is None:
            yield  # an older layerscope's store (no record): none is started (--force keeps refusing it)
            return
        before = not_layerscopes(store_dir)
        ok = False
        try:
            yield
            ok = True
        finally:
            try:
                _record(store_dir, before, ok)
            except OSError:
                if ok:
                    raise
                # the writer failed (a full disk, often): its error is the one to tell; the record made before
                # each file was written still names them all


def _range_marks(store_dir: Path) -> list[str]:
    """The claims and done marks range writers left under ``ranges/`` (named by their layout)."""
    from layerscope.store.store_layout import RANGE_KINDS, RANGES

    mark = re.compile(r"\d+\.(" + "|".join(map(re.escape, RANGE_KINDS)) + ")")
    folder = store_dir / RANGES
    if not folder.is_dir() or folder.is_symlink():
        return []
    return [f"{RANGES}/{p.name}" for p in folder.iterdir() if mark.fullmatch(p.name)]


def _record(store_dir: Path, before: list[str], ok: bool) -> None:
    from layerscope.errors import StoreError
    from layerscope.ownership import record
    from layerscope.store.store_layout import StoreLayout
    from layerscope.store.store_record import StoreRecord

    if not StoreLayout(store_dir).marker.is_file():
        return  # nothing was made, or the failed run removed what it made
    known = None
    if ok:
        try:
            known = {rel: rec.sha256 for rel, rec in (StoreRecord.read(store_dir).checksums or {}).items()}
        except StoreError:
            known = None
    record(store_dir, "store", names=_range_marks(store_dir), exclude=before, hashes=ok, known=known)
