"""The record of what layerscope wrote in a folder (``.layerscope.json``): reading it as untrusted data,
adding to it as files are written, and comparing it with what is on disk.

The record maps relative paths to what layerscope wrote there: ``{"dir": true}``, ``{"symlink": target}``,
or a file ``{"sha256": ..., "bytes": ..., "mtime_ns": ...}`` (``sha256`` null while the file is still
being written: any regular file of that name counts as layerscope's). A writer names each entry *before*
it writes it (:func:`note`), so a run killed at any moment leaves a folder whose files are all known, and
a file a user puts into the folder meanwhile is never recorded. The temporary sibling of a recorded file
that :func:`layerscope.jsonfile.write_json_atomic` makes (``<name>.tmp<pid>``) counts as layerscope's too.

A record is read from disk, so it may have been edited or shipped with a folder: every entry must be a
plain relative path whose folder lies inside the record's folder once symlinks are followed, and have one
well-formed kind. :func:`owned` refuses a record with any entry that fails, in one line, before anything
is compared or deleted.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from layerscope.errors import InputError

MARKER = ".layerscope.json"
MARKER_BYTES = 256 * 2**20  # the record of a store of millions of token files stays far below this

# The metadata file that identifies a directory of each kind made before markers existed.
SIGNATURE = {"export": "manifest.json", "store": "store.json", "result": "results.json", "index": "index.json",
             "lens": "lens.json"}

WHAT = {"export": "an export", "store": "a layer store", "result": "a result directory", "index": "an index",
        "lens": "a tuned lens"}

_SHA = re.compile(r"[0-9a-f]{64}")
_TEMP = re.compile(r"(.+)\.tmp\d+")


class RecordError(InputError):
    """A folder's record of layerscope's files was edited or damaged: nothing in the folder is deleted."""


@dataclass(frozen=True)
class Foreign:
    """What in a layerscope directory is not layerscope's to delete."""

    unrecorded: list[str]  # relative paths layerscope has no record of writing
    changed: list[str]  # files layerscope wrote that were changed since (the user's now)

    def __bool__(self) -> bool:
        return bool(self.unrecorded or self.changed)


def inside(root: Path, rel: object) -> Path | None:
    """``root / rel`` when ``rel`` (a relative path read from a file) stays inside ``root`` once resolved
    (no absolute path, no ``..``, no symlink leading out); None otherwise."""
    if not _plain(rel):
        return None
    root = Path(root)
    try:
        (root / rel).resolve().relative_to(root.resolve())
    except (ValueError, OSError, RuntimeError):
        return None
    return root / rel


def _plain(rel: object) -> bool:
    """A relative path of plain names: no absolute path, ``..``, ``.``, empty part, backslash or NUL."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel or rel.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _kind_ok(rec: object) -> bool:
    if not isinstance(rec, dict):
        return False
    if "symlink" in rec:
        return isinstance(rec["symlink"], str) and not rec.get("dir")
    if "dir" in rec:
        return rec["dir"] is True
    sha = rec.get("sha256")
    sizes_ok = all(isinstance(rec.get(k), int) or rec.get(k) is None for k in ("bytes", "mtime_ns"))
    return (sha is None or (isinstance(sha, str) and bool(_SHA.fullmatch(sha)))) and sizes_ok


def _entry_problem(root: Path, rel: object, rec: object) -> str | None:
    if not _plain(rel):
        return f"{rel!r} is not a relative path inside the folder"
    if not _kind_ok(rec):
        return f"{rel!r} has no valid kind (file with sha256, dir or symlink)"
    parent = root / rel if not isinstance(rec, dict) or "dir" in rec else (root / rel).parent
    try:
        parent.resolve().relative_to(root.resolve())
    except (ValueError, OSError, RuntimeError):
        return f"{rel!r} leads outside the folder through a symlink"
    return None


# ---------------------------------------------------------------- reading and writing the marker

def read_marker(path: Path) -> dict | None:
    """The marker of ``path`` as JSON, or None where it is missing or not a JSON object. A marker that is not a
    regular file (a FIFO would block the reader) or is far larger than a record is refused in one line."""
    from layerscope.jsonfile import FileTooLarge, JsonFileError, NotRegularFile, read_json

    marker = Path(path) / MARKER
    try:
        data = read_json(marker, limit=MARKER_BYTES, what="record of layerscope's files")
    except (NotRegularFile, FileTooLarge) as exc:
        raise RecordError(f"{exc}; layerscope deletes nothing there") from None
    except (JsonFileError, OSError):
        return None
    return data if isinstance(data, dict) else None


def owned(path: Path) -> dict[str, dict] | None:
    """The record of ``path`` (relative path -> entry), every entry checked; None when there is no record.
    Raises RecordError, naming the entries, when any entry could lead outside ``path`` or is malformed."""
    path = Path(path)
    marker = read_marker(path)
    entries = marker.get("owned") if marker else None
    if not isinstance(entries, dict):
        return None
    bad = [why for rel, rec in entries.items() if (why := _entry_problem(path, rel, rec))]
    if bad:
        more = f", and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise RecordError(f"{path / MARKER} was edited or damaged ({'; '.join(bad[:3])}{more}), so layerscope "
                          f"deletes nothing there; delete {path} yourself or choose another --out")
    return entries


def kind_of(path: Path) -> str | None:
    """The layerscope kind of directory ``path``: its marker's, else the one its metadata file implies."""
    path = Path(path)
    marker = read_marker(path) if (path / MARKER).is_file() else None
    if marker is not None and marker.get("kind") in SIGNATURE:
        return marker["kind"]
    for kind, name in SIGNATURE.items():
        if (path / name).is_file():
            return kind
    return None


def _write(path: Path, data: dict) -> None:
    """Replace the marker atomically (a temporary sibling, fsynced, renamed over it)."""
    from layerscope.jsonfile import write_json_atomic

    write_json_atomic(Path(path) / MARKER, data, indent=1)


def write_marker(path: Path, kind: str) -> None:
    """Mark directory ``path`` as one layerscope made, of ``kind``, with an empty record of its files."""
    import layerscope

    if kind not in SIGNATURE:
        raise ValueError(f"unknown directory kind {kind!r}")
    _write(path, {"kind": kind, "layerscope_version": layerscope.__version__,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "owned": {}})


def nested(path: Path) -> bool:
    """A layerscope directory of its own (an index inside a store): it counts by its own record."""
    marker = read_marker(path) if (path / MARKER).is_file() and not path.is_symlink() else None
    return marker is not None and marker.get("kind") in SIGNATURE and isinstance(marker.get("owned"), dict)


def walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative path, path) of every entry under ``root``, parents first; symlinks are not followed, and a
    nested layerscope directory is listed but not entered."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            p = Path(entry.path)
            rel = p.relative_to(root).as_posix()
            if rel == MARKER:
                continue
            yield rel, p
            if entry.is_dir(follow_symlinks=False) and not nested(p):
                stack.append(p)


def is_temp_of(rel: str, entries: dict) -> bool:
    """``rel`` is the temporary sibling (``<name>.tmp<pid>``) of a file the record lists."""
    m = _TEMP.fullmatch(rel)
    rec = entries.get(m.group(1)) if m else None
    return isinstance(rec, dict) and "dir" not in rec and "symlink" not in rec


# ---------------------------------------------------------------- adding to the record

def _signature(p: Path) -> dict:
    st = p.lstat()
    return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def _entry(p: Path, old: dict | None, hashes: bool, known: str | None, pending: bool) -> dict:
    from layerscope.hashing import file_sha256

    if p.is_symlink():
        return {"symlink": os.readlink(p)}
    if p.is_dir():
        return {"dir": True}
    sig = _signature(p)
    if known is not None:
        return {"sha256": known, **sig}
    if pending:
        return {"sha256": None, **sig}
    if old and old.get("sha256") and all(old.get(k) == v for k, v in sig.items()):
        return dict(old)  # unchanged since it was hashed: not read again
    return {"sha256": file_sha256(p) if hashes else None, **sig}


def _excluded(rel: str, exclude: Iterable[str]) -> bool:
    return any(rel == e or rel.startswith(e + "/") for e in exclude)


def _with_parents(rels: Iterable[str]) -> list[str]:
    out: dict[str, None] = {}
    for rel in rels:
        parts = rel.split("/")
        for i in range(1, len(parts) + 1):
            out["/".join(parts[:i])] = None
    return list(out)


def note(path: Path, files: Iterable[str] = (), dirs: Iterable[str] = ()) -> None:
    """Record, before writing them, the files and folders (relative paths) a writer is about to make in
    layerscope directory ``path`` (their parent folders too), files as still being written. Does nothing
    where ``path`` has no record (not a marked directory, or an older layerscope's)."""
    path = Path(path)
    marker = read_marker(path)
    entries = owned(path)
    if marker is None or entries is None or marker.get("kind") not in SIGNATURE:
        return
    files, dirs = list(files), list(dirs)
    for rel in files + dirs:
        if _entry_problem(path, rel, {"dir": True}):
            raise ValueError(f"not a path inside {path}: {rel!r}")
    folders = set(_with_parents(dirs)) | {p for f in files for p in _with_parents([f])[:-1]}
    for rel in sorted(folders):
        entries[rel] = {"dir": True}
    for rel in files:
        entries[rel] = {"sha256": None}
    marker["owned"] = entries
    _write(path, marker)


def record(path: Path, kind: str, *, names: Iterable[str] = (), everything: bool = False,
           exclude: Iterable[str] = (), hashes: bool = True, known: dict[str, str] | None = None,
           pending: bool = False) -> None:
    """Bring the record of ``path`` up to date with what is on disk: the entries it lists and ``names``
    (with their parent folders), each file hashed (``hashes=False``: recorded as still being written, so any
    content counts as layerscope's until it is recorded again); entries gone from disk are dropped.
    ``everything``: record every file and folder under ``path`` (only for a private folder no one else
    writes into, such as a staging directory). ``exclude``: relative paths that are not layerscope's
    (they were not when the writer started) and stay out. ``known``: hashes the writer already has.
    ``pending``: every file is about to be written again (recorded as still being written)."""
    path = Path(path)
    marker = read_marker(path) or {}
    if marker.get("kind") not in SIGNATURE:
        write_marker(path, kind)
        marker = read_marker(path) or {}
    old = owned(path) or {}
    exclude = list(exclude)
    if everything:
        rels = [rel for rel, _ in walk(path)]
    else:
        rels = _with_parents([*old, *(n for n in names if _plain(n))])
        rels += [rel for rel, _ in walk(path) if is_temp_of(rel, old)]
    entries: dict[str, dict] = {}
    for rel in rels:
        p = path / rel
        if _excluded(rel, exclude) or not os.path.lexists(p) or nested(p):
            continue
        if _entry_problem(path, rel, {"symlink": ""} if p.is_symlink() else {"dir": True}):
            continue  # a layerscope directory inside (an index in its store) counts by its own record
        try:
            entries[rel] = _entry(p, old.get(rel), hashes, (known or {}).get(rel), pending)
        except FileNotFoundError:  # a temporary file renamed away meanwhile
            continue
    marker["owned"] = entries
    _write(path, marker)


# ---------------------------------------------------------------- comparing the record with the disk

def matches(p: Path, rec: dict) -> bool:
    """What is at ``p`` is of the kind the entry ``rec`` records, and a hashed file still has its hash."""
    from layerscope.hashing import file_sha256

    if "symlink" in rec:
        return p.is_symlink() and os.readlink(p) == rec["symlink"]
    if p.is_symlink():
        return False
    if rec.get("dir"):
        return p.is_dir()
    if not p.is_file():
        return False
    if rec.get("sha256") is None:
        return True  # still being written by layerscope when it was recorded
    sig = _signature(p)
    if all(rec.get(k) == v for k, v in sig.items()):
        return True
    try:
        return sig["bytes"] == rec.get("bytes") and file_sha256(p) == rec["sha256"]
    except OSError:
        return False


def foreign(path: Path) -> Foreign | None:
    """What under layerscope directory ``path`` is not layerscope's to delete; None when it has no record
    (made by an older layerscope, or not by layerscope). RecordError when the record was tampered with."""
    path = Path(path)
    entries = owned(path)
    if entries is None:
        return None
    unrecorded: list[str] = []
    changed: list[str] = []
    skip: list[str] = []
    for rel, p in walk(path):
        if _excluded(rel, skip):
            continue
        if nested(p):  # a layerscope directory of its own: checked by its own record
            inner = foreign(p)
            if inner is not None:
                unrecorded += [f"{rel}/{r}" for r in inner.unrecorded]
                changed += [f"{rel}/{r}" for r in inner.changed]
                continue
        rec = entries.get(rel)
        if not isinstance(rec, dict):
            if is_temp_of(rel, entries) and p.is_file() and not p.is_symlink():
                continue
            unrecorded.append(rel + ("/" if p.is_dir() and not p.is_symlink() else ""))
            skip.append(rel)
            continue
        if not matches(p, rec):
            changed.append(rel)
            if "symlink" not in rec:
                skip.append(rel)
    return Foreign(unrecorded, changed)
