"""One writer per output directory: an exclusive, non-blocking OS file lock held while a process writes
an ``--out`` (a store, an export, a result directory, an index).

The lock is ``fcntl.flock`` on a small file *beside* the directory (``<parent>/.<name>.lock``), not
inside it, so it survives whatever a writer does to the directory itself (``--force`` replacing it, a
staged directory swapped in). It is keyed by the resolved path: a symlink to the same directory takes
the same lock. The kernel drops a flock when its process dies, so a writer killed with SIGKILL never
leaves a directory locked: the stale file is reused.

The file is removed on release. A racing process may have opened the old file before it was unlinked;
after taking the lock every process therefore checks that the path still names the file it locked, and
tries again if it does not.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Iterator

from layerscope.errors import InputError, LayerscopeError


class OutLockedError(InputError):
    """Another process is writing this directory right now."""


def lock_path(out: Path) -> Path:
    """``<parent>/.<name>.lock`` of the resolved ``out`` (symlinks followed, so every name of a directory
    takes one lock)."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.lock"


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return "pid unknown"
    return f"pid {text}" if text.isdigit() else "pid unknown"


def acquire(out: Path, *, error: type[LayerscopeError] = InputError,
            locked: type[LayerscopeError] = OutLockedError) -> tuple[int, Path]:
    """Take the lock of ``out``; return (file descriptor, lock file). Raise ``locked`` at once if another
    process holds it, ``error`` if it cannot be taken."""
    import fcntl

    from layerscope.ownership import check_writable

    check_writable(out)  # a read-only place is named as such, before its lock file is tried
    path = lock_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"cannot create {path.parent} for {out} ({exc.strerror})") from None
    for _ in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise error(f"cannot lock {out}: {exc.strerror} ({path})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise locked(f"{out} is being written by another process ({_holder(path)}); "
                             "wait for it or choose another --out") from None
            raise error(f"cannot lock {out}: {exc.strerror} ({path})") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder released (and unlinked) it between our open and our flock
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode("ascii"))
        return fd, path
    raise error(f"cannot lock {out}: the lock file {path} keeps changing; try again")


def release(path: Path, fd: int) -> None:
    """Unlink lock file ``path`` while still holding it, then drop the lock."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


@contextlib.contextmanager
def out_lock(out: str | Path, **kinds) -> Iterator[None]:
    """Hold ``out``'s write lock for the duration of the ``with`` block."""
    fd, path = acquire(Path(out), **kinds)
    try:
        yield
    finally:
        release(path, fd)
