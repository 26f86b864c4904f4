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

A path is only one name of a folder: a bind mount (or any second mount) of the folder itself reaches the
same folder through another parent, where the file beside it is another file. So the writer also locks the
folder itself (``flock`` on the directory: the lock belongs to its device and inode, whatever path leads
there), as soon as the folder exists: at once when it does, else when the writer creates it
(:func:`hold_folder`). A file system that cannot lock a directory keeps the lock beside it alone.
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


_FOLDER_LOCKS: dict[int, int] = {}  # the fd of a lock beside a folder -> the fd locking the folder itself
_HELD: dict[str, int] = {}  # lock file -> its fd, for the locks this process holds


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
        try:  # the holder's pid, for the messages of a second writer; the flock is the lock
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode("ascii"))
        except OSError:  # a full disk: the lock holds without it, and the writer says what is full
            pass
        _HELD[str(path)] = fd
        try:
            _lock_folder(out, fd, error=error, locked=locked)
        except BaseException:
            release(path, fd)
            raise
        return fd, path
    raise error(f"cannot lock {out}: the lock file {path} keeps changing; try again")


def _lock_folder(out: Path, fd: int, *, error: type[LayerscopeError], locked: type[LayerscopeError]) -> None:
    """Lock folder ``out`` itself (its device and inode), tied to the lock ``fd`` beside it; nothing when it
    does not exist yet, or its file system cannot lock a directory."""
    import fcntl

    try:
        dfd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        raise error(f"cannot lock {out}: {exc.strerror}") from None
    old = _FOLDER_LOCKS.get(fd)
    if old is not None:
        held, now = os.fstat(old), os.fstat(dfd)
        if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
            os.close(dfd)
            return
        os.close(_FOLDER_LOCKS.pop(fd))  # the folder this writer replaced: its new one is locked instead
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(dfd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise locked(f"{out} is being written by another process (it reaches this folder by another path, "
                         "e.g. a bind mount); wait for it or choose another --out") from None
        return  # no flock on folders here (some network file systems): the lock beside it stands alone
    _FOLDER_LOCKS[fd] = dfd


def hold_folder(out: str | Path, *, error: type[LayerscopeError] = InputError,
                locked: type[LayerscopeError] = OutLockedError) -> None:
    """Once a writer holding ``out``'s lock has created the folder: lock the folder itself too, so a path
    made to it later (a bind mount) leads to the same lock. Nothing when this process holds no lock of ``out``."""
    fd = _HELD.get(str(lock_path(Path(out))))
    if fd is not None:
        _lock_folder(Path(out), fd, error=error, locked=locked)


def release(path: Path, fd: int) -> None:
    """Unlink lock file ``path`` while still holding it, then drop the lock (and the folder's own)."""
    dfd = _FOLDER_LOCKS.pop(fd, None)
    if dfd is not None:
        os.close(dfd)
    _HELD.pop(str(path), None)
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
