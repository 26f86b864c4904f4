"""``layerscope cache list`` / ``layerscope cache clear``: what layerscope keeps in its cache root, and removing it.

The cache root is ``$LAYERSCOPE_HOME`` or ``~/.cache/layerscope``.  It holds
``exports/`` (ONNX exports made on first use, keyed by content: export/cache.py),
``stores/`` (vectors of analysis runs: analyses/cache.py) and ``hashes/`` (file
hashes remembered by stat signature: model/identity.py).  Only directories that
layerscope made are listed or removed: an entry must hold its marker file
(``manifest.json`` or ``store.json``) as a plain file; a symlink is never
followed, and anything else found there is reported and left alone.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerscope.errors import InputError
from layerscope.store.store_layout import STORE_JSON

MARKERS = {"exports": "manifest.json", "stores": STORE_JSON}
PARTIAL_GRACE_S = 24 * 3600  # an unfinished staging dir younger than this may be another process at work


@dataclass
class Entry:
    kind: str  # exports, stores, or partial (a staging dir a crash left behind)
    path: Path
    model: str
    size: int
    age_days: float
    made_by: str | None


@dataclass
class Skipped:
    path: Path
    reason: str


def _size(path: Path) -> int:
    """Bytes under ``path``, links counted as links (os.walk does not descend into linked dirs)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        linked_dirs = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in filenames + linked_dirs:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def _read_json(path: Path) -> dict[str, Any]:
    from layerscope.jsonfile import read_json_dict

    return read_json_dict(path)  # bounded, never a FIFO waited on, {} for anything but an object


def _describe(kind: str, path: Path, now: float) -> Entry | Skipped:
    marker = path / MARKERS[kind]
    if path.name.startswith(".") and ".partial-" in path.name:
        age = (now - path.lstat().st_mtime) / 86400
        return Entry("partial", path, "-", _size(path), age, None)
    if marker.is_symlink() or not marker.is_file():
        return Skipped(path, f"no {MARKERS[kind]}: not made by layerscope, left alone")
    from layerscope.store.store_record import embedded_manifest

    doc = _read_json(marker)
    manifest = embedded_manifest(doc) if kind == "stores" else doc  # an export's marker is its manifest
    src = manifest.get("source") or {}
    model = src.get("alias") or src.get("path_or_id") or src.get("spec") or "?"
    made_by = manifest.get("layerscope_version")
    return Entry(kind, path, str(model), _size(path), (now - marker.stat().st_mtime) / 86400, made_by)


def _kind_dir(root: Path, kind: str) -> Path | Skipped | None:
    path = root / kind
    if path.is_symlink():
        return Skipped(path, "is a symlink; layerscope does not follow it out of the cache root")
    return path if path.is_dir() else None


def scan(root: Path | None = None, kinds: tuple[str, ...] = tuple(MARKERS)) -> tuple[list[Entry], list[Skipped]]:
    """Every entry layerscope made under the cache root, and what it found there but did not make."""
    from layerscope.model.home import cache_root

    root = Path(root) if root is not None else cache_root()
    entries: list[Entry] = []
    skipped: list[Skipped] = []
    now = time.time()
    for kind in kinds:
        kind_dir = _kind_dir(root, kind)
        if isinstance(kind_dir, Skipped):
            skipped.append(kind_dir)
            continue
        if kind_dir is None:
            continue
        for item in sorted(kind_dir.iterdir()):
            if item.is_symlink():
                skipped.append(Skipped(item, "is a symlink; not followed"))
            elif item.is_dir():
                found = _describe(kind, item, now)
                (entries if isinstance(found, Entry) else skipped).append(found)
            elif not item.name.endswith(".lock"):  # lock files are tiny and may be held right now
                skipped.append(Skipped(item, "a file layerscope did not make, left alone"))
    return entries, skipped


def clear(kinds: tuple[str, ...] = tuple(MARKERS), older_than_days: float | None = None,
          root: Path | None = None) -> tuple[list[Entry], list[Skipped]]:
    """Remove layerscope's entries of ``kinds`` (only those older than ``older_than_days`` when given)."""
    from layerscope.model.home import cache_root

    if older_than_days is not None and not older_than_days >= 0:
        raise InputError(f"--older-than wants a number of days >= 0, not {older_than_days}")
    root = Path(root) if root is not None else cache_root()
    entries, skipped = scan(root, kinds)
    removed = []
    for entry in entries:
        if entry.kind == "partial" and entry.age_days * 86400 < PARTIAL_GRACE_S:
            skipped.append(Skipped(entry.path, "unfinished and recent: another process may be writing it"))
            continue
        if older_than_days is not None and entry.age_days < older_than_days:
            continue
        release = _writer_lock(entry)
        if release is None:
            skipped.append(Skipped(entry.path, "being written by another process right now; left alone"))
            continue
        try:
            shutil.rmtree(entry.path)  # removes links inside, never what they point to
        finally:
            release()
        removed.append(entry)
    hashes = root / "hashes"
    if set(kinds) == set(MARKERS) and older_than_days is None and hashes.is_dir() and not hashes.is_symlink():
        shutil.rmtree(hashes)
    return removed, skipped


def _writer_lock(entry: Entry):
    """Take the lock a writer of ``entry`` holds (a store's write lock, an export's file lock), so it is
    never removed under a run that is filling it; a function releasing it, or None when it is held."""
    if entry.kind == "stores":
        from layerscope.store.store_lock import StoreLockedError, acquire, release

        try:
            fd = acquire(entry.path)
        except StoreLockedError:
            return None
        return lambda: release(entry.path, fd)
    if entry.kind == "exports":
        from filelock import FileLock, Timeout

        lock = FileLock(str(entry.path.parent / f".{entry.path.name}.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return None
        return lock.release
    return lambda: None


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
