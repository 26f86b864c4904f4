"""One writer per store: an exclusive, non-blocking OS file lock held while a process writes a store.

The lock is ``fcntl.flock`` on a small file *beside* the store directory
(``<parent>/.<name>.lock``), not inside it, so it survives whatever a writer
does to the directory itself (``--force`` replacing it, a staged directory
swapped in).  The kernel drops a flock when its process dies, so a writer
killed with SIGKILL never leaves a store locked: the stale file is reused.

The file is removed on release.  A racing process may have opened the old file
before it was unlinked; after taking the lock every process therefore checks
that the path still names the file it locked, and tries again if it does not.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Iterator

from layerscope.errors import StoreError


class StoreLockedError(StoreError):
    """Another process is writing this store right now."""


def lock_path(store_dir: Path) -> Path:
    store_dir = Path(store_dir).absolute()
    return store_dir.parent / f".{store_dir.name}.lock"


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "pid unknown"
    return f"pid {text}" if text.isdigit() else "pid unknown"


def acquire(store_dir: Path) -> int:
    """Take the lock; return its file descriptor.  Raise StoreError at once if another process holds it."""
    import fcntl

    path = lock_path(store_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {path.parent} for the store ({exc.strerror})") from None
    for _ in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot lock {store_dir}: {exc.strerror} ({path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLockedError(f"{store_dir} is being written by another process ({_holder(path)}); "
                                 "wait for it or choose another --out") from None
            raise StoreError(f"cannot lock {store_dir}: {exc.strerror} ({path})") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released (and unlinked) it between our open and our flock
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode("ascii"))
        return fd
    raise StoreError(f"cannot lock {store_dir}: the lock file {path} keeps changing; try again")


def release(store_dir: Path, fd: int) -> None:
    """Unlink the lock file while still holding it, then drop the lock."""
    with contextlib.suppress(OSError):
        os.unlink(lock_path(store_dir))
    os.close(fd)


@contextlib.contextmanager
def store_lock(store_dir: str | Path) -> Iterator[None]:
    """Hold the store's write lock for the duration of the ``with`` block."""
    store_dir = Path(store_dir)
    fd = acquire(store_dir)
    try:
        yield
    finally:
        release(store_dir, fd)
