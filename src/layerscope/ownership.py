"""Which directories layerscope may replace: the one rule behind every ``--out`` and ``--force``.

Every directory layerscope makes (an export, a store, a result directory, an index) carries a
small marker file, ``.layerscope.json``, naming its kind and recording every file and folder
layerscope wrote there, each file with its sha256, size and modification time when written
(``owned``). ``--force`` replaces a directory only when

* it is of the kind being written (its marker says so; directories made before markers existed
  are recognised by their own metadata file: manifest.json, store.json, results.json, index.json),
* it holds nothing but what the record lists, each file unchanged since layerscope wrote it (a
  ``notes.md`` a user put there, or a ``report.md`` the user edited, is never deleted: the directory
  is refused instead, naming the files); a layerscope directory inside it (an index built in its
  store) counts by its own record, and
* it does not hold any input of the command (the corpus, the model being exported, the store an
  index is built from).

Nothing is decided by a file's name. A directory without a record (made by an older layerscope)
is refused, saying to delete it by hand or choose another ``--out``. Anything else is refused with
one line that says what is there.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from layerscope.errors import InputError
from layerscope.owned_record import (MARKER, SIGNATURE, WHAT, Foreign, RecordError, foreign, inside, is_temp_of,
                                     kind_of, matches, nested, note, owned, record, walk, write_marker)

__all__ = ["MARKER", "SIGNATURE", "WHAT", "Claim", "Foreign", "RecordError", "Recorder", "check_output_path",
           "check_replaceable", "check_under", "check_writable", "claim", "clear_own", "describe_foreign", "foreign",
           "hex_part", "inside", "kind_of", "not_layerscopes", "note", "owned", "record", "remove", "remove_if_empty",
           "rewriting", "safe_part", "write_marker", "writing"]


@dataclass(frozen=True)
class Claim:
    """What :func:`claim` found at an output path."""

    path: Path
    existed: bool  # the path existed before this command (False: the command creates it)
    kind: str | None  # the layerscope kind found there, None for a missing or empty directory
    replace: bool  # the caller may delete it and write a new one


# ---------------------------------------------------------------- path parts from files

_HEX = re.compile(r"[0-9a-f]+")


def safe_part(text: object, what: str = "a name") -> str:
    """``text`` (a name, revision or alias read from a file) as one safe path component: characters other
    than letters, digits and ``._+-`` become ``-``, and no ``.``/``..`` or leading dot can remain."""
    part = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(text)).strip("-.")
    if not part:
        raise InputError(f"{what} {str(text)!r} leaves nothing usable as a folder name; give --out")
    return part


def hex_part(text: object, what: str, length: int = 12) -> str:
    """The first ``length`` characters of a hash read from a file, which must be lowercase hex."""
    value = str(text)
    if len(value) < length or not _HEX.fullmatch(value):
        raise InputError(f"{what} is {value[:80]!r}, not a sha256 hex digest; the file was edited or damaged "
                         "(re-export the model, or give --out)")
    return value[:length]


def check_under(path: Path, root: Path, what: str = "the result folder") -> Path:
    """``path`` once resolved (symlinks followed) lies inside ``root``; one line otherwise."""
    path, root = Path(path), Path(root)
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        raise InputError(f"{what} {path} would lie outside {root}/ (a name or hash read from a file leads "
                         f"there); give --out") from None
    return path


def _names(names: list[str], limit: int = 3) -> str:
    if limit == 3:
        return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f", and {more} more" if more > 0 else "")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _describe(path: Path, names: list[str], limit: int = 3) -> str:
    return f"{path}/ holds {_count(len(names), 'file')} that layerscope did not make ({_names(names, limit)})"


def describe_foreign(path: Path, found: Foreign) -> str:
    parts = []
    if found.unrecorded:
        parts.append(_describe(path, found.unrecorded, limit=10))
    if found.changed:
        what = _count(len(found.changed), "file")
        parts.append(f"{path}/ holds {what} layerscope wrote that {'was' if len(found.changed) == 1 else 'were'} "
                     f"changed since, so {'it is' if len(found.changed) == 1 else 'they are'} yours now "
                     f"({_names(found.changed, limit=10)})")
    return "; ".join(parts)


def _no_record(path: Path, kind: str, option: str) -> str:
    return (f"{path} holds {WHAT[kind]} made by an older layerscope, which did not record the files it wrote, "
            f"so --force cannot tell them from yours; delete it yourself (rm -r {path}) or choose another {option}")


# ---------------------------------------------------------------- claiming and replacing

def _inside(child: Path, parent: Path) -> bool:
    try:
        child.resolve().relative_to(parent.resolve())
        return True
    except ValueError:
        return False


def check_output_path(path: Path, option: str = "--out") -> Path:
    """``path`` may become a directory: it is not a regular file (or a file's child)."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise InputError(f"{option} {path}: {p} is a file, not a directory; choose another {option}")
    check_writable(path, option)
    return path


def check_writable(path: Path, what: str = "--out") -> None:
    """One line, before any work, when ``path`` (or the nearest folder that exists above it, where it
    would be made) cannot be written: a read-only file system, or a folder without write permission.
    A path inside layerscope's cache root is named as the cache (``LAYERSCOPE_HOME``), which the user
    chose rather than ``what``."""
    import os

    path = Path(path)
    here = next((p for p in (path, *path.absolute().parents) if p.exists()), None)
    if here is None or not here.is_dir() or os.access(here, os.W_OK | os.X_OK):
        return  # a file in the way is check_output_path's line
    try:
        readonly = bool(os.statvfs(here).f_flag & os.ST_RDONLY)
    except OSError:
        readonly = False
    why = "is on a read-only file system" if readonly else "is not writable by this user"
    home = Path(os.environ.get("LAYERSCOPE_HOME", Path.home() / ".cache" / "layerscope")).absolute()
    if path.absolute() == home or home in path.absolute().parents:
        raise InputError(f"layerscope's cache {home} cannot be written: {here} {why}; set LAYERSCOPE_HOME "
                         "to a writable folder")
    raise InputError(f"{what} {path} cannot be written: {here} {why}; choose a writable place")


def claim(path: str | Path, kind: str, *, force: bool = False, keep: bool = False,
          inputs: Iterable[str | Path | None] = (), option: str = "--out") -> Claim:
    """Check that ``kind`` may be written at ``path``; nothing is deleted here.

    ``keep``: the caller continues or reuses an existing directory of this kind (e.g. ``--resume``).
    ``force``: the caller will replace an existing directory of this kind (``replace`` in the answer).
    Raises InputError for anything else: a file, a foreign or differently-kinded non-empty folder, a
    folder holding one of ``inputs``, one without a record of its files, one holding files layerscope did
    not write or that changed since, or (without ``force``/``keep``) an existing one of this kind.
    """
    path = check_output_path(Path(path), option)
    if not path.exists():
        return Claim(path, False, None, False)
    entries = [e.name for e in path.iterdir()]
    if not entries:
        return Claim(path, True, None, False)
    found = kind_of(path)
    if found != kind:
        if found is not None:
            raise InputError(f"{option} {path} holds {WHAT[found]}, not {WHAT[kind]}; choose another {option}")
        raise InputError(_describe(path, sorted(entries)) + f"; choose another {option}")
    if keep:
        return Claim(path, True, kind, False)
    if not force:
        also = "--resume to continue it, " if kind in ("store", "lens") else ""
        raise InputError(f"{path} already holds {WHAT[kind]}; pass {also}--force to replace it or choose another "
                         f"{option}")
    held = [Path(p) for p in inputs if p is not None and str(p) not in ("", "-")]
    for p in held:
        if p.exists() and _inside(p, path):
            raise InputError(f"{option} {path} holds this command's input {p}; --force never deletes it: "
                             f"choose another {option}")
    check_replaceable(path, kind, option)
    return Claim(path, True, kind, True)


def check_replaceable(path: Path, kind: str, option: str = "--out") -> None:
    """Raise InputError unless everything in ``path`` is what layerscope wrote there, unchanged."""
    if Path(path).is_symlink():
        raise InputError(f"{option} {path} is a symlink to {os.path.realpath(path)}; --force replaces only a real "
                         f"folder: give {option} its real path")
    found = foreign(path)
    if found is None:
        raise InputError(_no_record(path, kind, option))
    if found:
        raise InputError(describe_foreign(path, found) + f"; --force only replaces what layerscope wrote: move "
                         f"them or choose another {option}")


def _delete_owned(path: Path) -> None:
    """Delete the files and folders ``path``'s record lists (nested layerscope directories by their own
    records), deepest first, then ``path`` itself if nothing else is left."""
    entries = owned(path) or {}  # checked: no entry leads outside ``path``
    for rel, p in sorted(walk(path), key=lambda item: item[0].count("/"), reverse=True):
        if nested(p):
            _delete_owned(p)
    _delete_entries(path, entries)
    try:
        os.rmdir(path)
    except OSError:
        left = sorted(e.name for e in path.iterdir()) if path.is_dir() else []
        raise InputError(f"{path} changed while this command ran ({_names(left)} appeared or changed); those "
                         "were not deleted") from None


def _delete_entries(path: Path, entries: dict, exclude: Iterable[str] = ()) -> None:
    """Delete the recorded ``entries`` of ``path`` (deepest first; each only while it is still what the record
    says, a folder only once empty) and their temporary siblings, then the record."""
    exclude = list(exclude)
    temps = [rel for rel, p in walk(path) if is_temp_of(rel, entries) and rel not in entries]
    for rel in sorted([*entries, *temps], key=lambda r: (r.count("/"), r), reverse=True):
        p = path / rel
        if any(rel == e or rel.startswith(e + "/") for e in exclude) or not os.path.lexists(p):
            continue
        if not matches(p, entries.get(rel) or {"sha256": None}):
            continue  # not what layerscope wrote there (any more): left, and the folder with it
        if entries.get(rel, {}).get("dir"):
            with contextlib.suppress(OSError):
                os.rmdir(p)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    with contextlib.suppress(FileNotFoundError):
        (path / MARKER).unlink()


def remove(path: Path, kind: str) -> None:
    """Delete a directory that :func:`claim` allowed to be replaced, re-checking it first: only the files
    its record lists, unchanged, are deleted."""
    path = Path(path)
    found = foreign(path) if kind_of(path) == kind else None
    if found is None or found:
        what = describe_foreign(path, found) if found else "its record of layerscope's files is gone"
        raise InputError(f"{path} changed while this command ran ({what}); it was not deleted")
    _delete_owned(path)


def clear_own(path: Path, kind: str, *, exclude: Iterable[str] = ()) -> None:
    """Delete what layerscope wrote inside ``path``, as its record names it (but for ``exclude``: entries that
    were not its own when the writer started); leave anything else, and the folder itself."""
    path = Path(path)
    if not path.is_dir() or kind_of(path) != kind:
        return
    _delete_entries(path, owned(path) or {}, exclude)


def remove_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def not_layerscopes(path: Path) -> list[str]:
    """Relative paths under ``path`` that are not layerscope's at this moment (all of them without a record)."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = foreign(path)
    if found is None:
        return [rel for rel, _ in walk(path)]
    return [r.rstrip("/") for r in found.unrecorded + found.changed]


def rewriting(path: Path, kind: str) -> None:
    """Before a writer continues layerscope directory ``path`` in place: mark the files its record lists as
    being written again (their hashes are taken when it ends), so a run killed meanwhile leaves files that
    ``--force`` knows as layerscope's. A file that was already the user's stays out."""
    path = Path(path)
    if kind_of(path) == kind and owned(path) is not None:
        record(path, kind, exclude=not_layerscopes(path), pending=True)


class Recorder:
    """The files a writer names, as it writes them, in a layerscope directory it changes in place (given by
    :func:`writing`). Each name is recorded before the writer writes it (as still being written, so a run
    killed meanwhile leaves it known as layerscope's) and hashed when the writer ends; a file nobody named
    (one a user put there during the run) stays out of the record."""

    def __init__(self, path: Path, before: Iterable[str], live: bool) -> None:
        self.path, self._before, self._live = path, set(before), live
        self.names: list[str] = []

    def add(self, *names: str) -> None:
        """Name files (relative paths) the writer is about to write, or has just written."""
        new = [n for n in names if n not in self._before and n not in self.names]
        self.names += new
        if self._live and new and self.path.is_dir():
            note(self.path, files=new)


@contextlib.contextmanager
def writing(path: str | Path, kind: str) -> Iterator[Recorder]:
    """Around a writer that adds to or rewrites a layerscope directory in place: the files it names on the
    :class:`Recorder` this yields are recorded when it ends, however it ends, beside what the record listed
    already; anything else that appears meanwhile, and what was not layerscope's before, is left out. A
    directory without a record (an older layerscope's) gets none."""
    path = Path(path)
    if path.is_dir() and any(path.iterdir()) and foreign(path) is None:
        yield Recorder(path, (), live=False)  # made by an older layerscope: --force keeps refusing it, saying why
        return
    before = not_layerscopes(path)
    recorder = Recorder(path, before, live=True)
    try:
        yield recorder
    finally:
        if path.is_dir() and (recorder.names or owned(path) is not None):
            record(path, kind, names=recorder.names, exclude=before)
