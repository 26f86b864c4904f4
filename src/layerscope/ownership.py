"""Which directories layerscope may replace: the one rule behind every ``--out`` and ``--force``.

Every directory layerscope makes (an export, a store, a result directory, an index)
carries a small marker file, ``.layerscope.json``, naming its kind. ``--force`` replaces
a directory only when

* it is of the kind being written (its marker says so; directories made before markers
  existed are recognised by their own metadata file: manifest.json, store.json,
  results.json, index.json),
* everything in it belongs to that kind's layout (a ``notes.md`` a user put there is
  never deleted: the directory is refused instead, naming the file), and
* it does not hold any input of the command (the corpus, the model being exported,
  the store an index is built from).

Anything else is refused with one line that says what is there.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from layerscope.errors import InputError

MARKER = ".layerscope.json"

# The metadata file that identifies a directory of each kind made before markers existed.
SIGNATURE = {"export": "manifest.json", "store": "store.json", "result": "results.json", "index": "index.json"}

# What layerscope itself writes at the top of each kind of directory (shell patterns).
LAYOUT = {
    "export": ("manifest.json", "model*.onnx", "model*.onnx_data", "*.onnx.tmp", "lens-k*.onnx", "lens-k*.onnx_data", "lens-k*.json",
               "lm_head.safetensors",
               "tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.txt", "vocab.json",
               "merges.txt", "spiece.model", "sentencepiece.bpe.model", "config.json", "chat_template.jinja",
               "trt_cache", "peers", "*.tmp*"),
    "store": ("store.json", "texts.jsonl", "texts.jsonl.partial", "lengths.npy", "done.npy", "arrays",
              "arrays.partial", "tokens", "tokens.partial", "index-*", "*.lock", "*.tmp*", "checksums*", "shards",
              "ray-offsets.npy"),
    "result": ("results.json", "report.md", "*.csv", "*.png", "*.svg", "*.html", "mteb", "*.tmp*"),
    "index": ("index.json", "index.faiss", "index.faiss.partial", "*.tmp*"),
}

WHAT = {"export": "an export", "store": "a layer store", "result": "a result directory", "index": "an index"}


@dataclass(frozen=True)
class Claim:
    """What :func:`claim` found at an output path."""

    path: Path
    existed: bool  # the path existed before this command (False: the command creates it)
    kind: str | None  # the layerscope kind found there, None for a missing or empty directory
    replace: bool  # the caller may delete it and write a new one


def kind_of(path: Path) -> str | None:
    """The layerscope kind of directory ``path``: its marker's, else the one its metadata file implies."""
    path = Path(path)
    marker = path / MARKER
    if marker.is_file():
        try:
            kind = json.loads(marker.read_text(encoding="utf-8")).get("kind")
        except (OSError, ValueError, AttributeError):
            kind = None
        if kind in SIGNATURE:
            return kind
    for kind, name in SIGNATURE.items():
        if (path / name).is_file():
            return kind
    return None


def write_marker(path: Path, kind: str) -> None:
    """Mark directory ``path`` as one layerscope made, of ``kind``."""
    import layerscope

    if kind not in SIGNATURE:
        raise ValueError(f"unknown directory kind {kind!r}")
    data = {"kind": kind, "layerscope_version": layerscope.__version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (Path(path) / MARKER).write_text(json.dumps(data) + "\n", encoding="utf-8")


def foreign_entries(path: Path, kind: str) -> list[str]:
    """Names at the top of ``path`` that are not part of ``kind``'s layout."""
    patterns = LAYOUT[kind] + (MARKER,)
    return sorted(e.name for e in Path(path).iterdir()
                  if not any(fnmatch.fnmatchcase(e.name, p) for p in patterns))


def _describe(path: Path, names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{path}/ holds {len(names)} file{'s' if len(names) != 1 else ''} that layerscope did not make ({shown})"


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
    if here is None or os.access(here, os.W_OK | os.X_OK):
        return
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
    folder holding one of ``inputs``, or (without ``force``/``keep``) an existing one of this kind.
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
    if force and path.is_symlink():
        raise InputError(f"{option} {path} is a symlink to {path.resolve()}; --force does not replace through a "
                         f"link: pass {path.resolve()} itself, or another {option}")
    if not force:
        also = "--resume to continue it, " if kind == "store" else ""
        raise InputError(f"{path} already holds {WHAT[kind]}; pass {also}--force to replace it or choose another "
                         f"{option}")
    held = [Path(p) for p in inputs if p is not None and str(p) not in ("", "-")]
    for p in held:
        if p.exists() and _inside(p, path):
            raise InputError(f"{option} {path} holds this command's input {p}; --force never deletes it: "
                             f"choose another {option}")
    foreign = foreign_entries(path, kind)
    if foreign:
        raise InputError(_describe(path, foreign) + f"; --force only replaces what layerscope made: move them "
                         f"or choose another {option}")
    return Claim(path, True, kind, True)


def remove(path: Path, kind: str) -> None:
    """Delete a directory that :func:`claim` allowed to be replaced (re-checking its kind first)."""
    import shutil

    path = Path(path)
    if kind_of(path) != kind or foreign_entries(path, kind):
        raise InputError(f"{path} changed while this command ran; it was not deleted")
    shutil.rmtree(path)


def clear_own(path: Path, kind: str) -> None:
    """Delete what belongs to ``kind``'s layout (and the marker) inside ``path``; leave anything else."""
    import shutil

    path = Path(path)
    if not path.is_dir():
        return
    foreign = set(foreign_entries(path, kind))
    for entry in path.iterdir():
        if entry.name in foreign:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def remove_if_empty(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
