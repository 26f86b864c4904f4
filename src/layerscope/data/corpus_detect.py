"""Which corpus format a source is, and whether the reader options fit it (the cheap checks run before reading)."""

from __future__ import annotations

import os
from pathlib import Path

from layerscope.data.corpus_lines import BOM
from layerscope.errors import InputError

FORMATS = ("txt", "jsonl", "csv", "tsv", "parquet")
_EXTENSIONS = {
    ".txt": "txt",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
}
_FMT_ALIASES = {"text": "txt", "ndjson": "jsonl", "jsonlines": "jsonl", "pq": "parquet"}
_SUPPORTED_HINT = (
    "supported: .txt, .jsonl, .ndjson, .csv, .tsv, .parquet, the text formats gzipped "
    "(e.g. .jsonl.gz), or - for stdin"
)
_FMT_HINT = "or name the format explicitly (fmt=..., --format on the command line)"
DEFAULT_FIELD = "text"


def detect_format(source: str | os.PathLike[str]) -> str:
    """The format a source's name implies: txt, jsonl, csv, tsv, parquet or stdin.

    Only the name is looked at. A trailing ``.gz`` is skipped over (``a.csv.gz`` is
    ``csv``); unknown names raise ``InputError``.
    """
    if str(source) == "-":
        return "stdin"
    path = Path(source)
    suffixes = [s.lower() for s in path.suffixes]
    gz = bool(suffixes) and suffixes[-1] == ".gz"
    if gz:
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    fmt = _EXTENSIONS.get(ext)
    if fmt == "parquet" and gz:
        raise InputError(
            f"{source}: a gzipped parquet file is not supported; gunzip it first "
            "(parquet compresses its columns itself)"
        )
    if fmt is None:
        shown = (ext + (".gz" if gz else "")) or "(no extension)"
        extra = ""
        if ext == ".json":
            extra = (
                "; a .json file holding a list is not read: write one JSON object per "
                "line and name it .jsonl"
            )
        raise InputError(
            f"{source}: unknown corpus file type {shown}{extra}; {_SUPPORTED_HINT}, "
            f"{_FMT_HINT}"
        )
    return fmt


def resolve_field(text_field: str | None, column: str | None) -> str | None:
    if text_field is not None and column is not None and text_field != column:
        raise InputError(
            f"text_field {text_field!r} and column {column!r} name the same setting "
            "(the field/column holding the text); pass only one"
        )
    field = text_field if text_field is not None else column
    if field is not None and not field:
        raise InputError(
            "the text field/column name is empty; pass the name of the column holding the texts"
        )
    return field


def _normalize_fmt(fmt: str) -> str:
    key = fmt.strip().lower().lstrip(".")
    key = _FMT_ALIASES.get(key, key)
    if key not in FORMATS and key != "stdin":
        raise InputError(f"unknown corpus format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    return key


def resolve_stdin_fmt(fmt: str | None) -> str:
    key = "txt" if fmt is None else _normalize_fmt(fmt)
    if key == "stdin":
        key = "txt"
    if key == "parquet":
        raise InputError(
            "parquet cannot be read from stdin; save it to a file and pass its path"
        )
    return key


def resolve_file_fmt(fmt: str | None, source: str | os.PathLike[str]) -> str:
    if fmt is None:
        return detect_format(source)
    key = _normalize_fmt(fmt)
    if key == "stdin":
        raise InputError(f"format 'stdin' is only for the source '-', not for the file {source}")
    return key


def check_options(name: str, fmt: str, field: str | None, id_field: str | None) -> None:
    if fmt != "txt":
        if id_field is not None and not id_field:
            raise InputError("the id field/column name is empty; pass a name or leave it unset")
        return
    if field is not None and field != DEFAULT_FIELD:
        raise InputError(
            f"{name} is read as plain text (one text per line), so the text field/column "
            f"{field!r} does not apply; leave it unset, or pass the jsonl/csv/tsv/parquet "
            "file it belongs to"
        )
    if id_field is not None:
        raise InputError(
            f"{name} is read as plain text (one text per line), which has no ids, so the "
            f"id field/column {id_field!r} does not apply; leave it unset (rows get "
            "ids 0, 1, 2, ...) or use a jsonl/csv/tsv/parquet file"
        )


def check_path(path: Path, name: str) -> None:
    if not path.exists():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise InputError(f"{name} does not exist{where}; check the path")
    if path.is_dir():
        found = sorted(
            p.name for p in path.iterdir()
            if p.is_file() and _looks_supported(p)
        )
        hint = ""
        if found:
            shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            hint = f" (it holds: {shown})"
        raise InputError(f"{name} is a directory; pass a corpus file inside it{hint}")
    if not (path.is_file() or path.is_fifo() or path.is_socket()):
        raise InputError(f"{name} is a device, not a file, and never ends; pass a corpus file or pipe texts in")


def is_empty_file(path: Path) -> bool:
    """True for a 0-byte file or one holding only a UTF-8 BOM."""
    size = path.stat().st_size
    if size > len(BOM):
        return False
    try:
        return path.read_bytes() in (b"", BOM)
    except OSError:
        return False  # reported with its reason when the file is opened


def _looks_supported(path: Path) -> bool:
    try:
        detect_format(path)
    except InputError:
        return False
    return True
