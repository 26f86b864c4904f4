"""Streaming corpus readers: a user's file (or stdin) becomes a stream of ``Record``s.

Supported inputs:

* ``.txt``: one text per line; only the line ending (``\\n`` or ``\\r\\n``) is removed.
* ``.jsonl`` / ``.ndjson``: one JSON object per line (the text under ``text_field``,
  default ``"text"``), or a JSON string per line (the string is the text).
* ``.csv`` / ``.tsv``: a header row, then one row per text (``column``, default
  ``"text"``). CSV uses standard quoting; TSV has no quoting at all (``"`` is kept).
* ``.parquet``: read record batch by record batch with pyarrow (``column``, default
  ``"text"``).
* ``-``: stdin, one text per line (``fmt`` may say it is jsonl/csv/tsv instead).
* gzip-compressed versions of the text formats (``corpus.jsonl.gz``); compression is
  recognised by the gzip magic bytes, so ``fmt`` overrides work for them too.

Every bad input raises ``InputError`` with one line naming the file, the line where
relevant, and what to fix. Nothing is dropped silently: empty and whitespace-only
texts are yielded (so row ``i`` of the output is row ``i`` of the input) and counted
in ``CorpusStats.empty``.

Readers stream: the file is read line by line (or batch by batch), so memory does
not grow with the corpus. Only the ids seen so far are kept, to catch duplicates.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import importlib.util
import json
import os
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from layerscope.errors import InputError, MissingExtraError

__all__ = ["Record", "CorpusStats", "iter_corpus", "read_corpus", "detect_format"]

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
_DEFAULT_FIELD = "text"
_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"
_STDIN_NAME = "stdin"
_PARQUET_BATCH_ROWS = 2048
_MAX_LISTED = 20


@dataclass(frozen=True, slots=True)
class Record:
    """One text of the corpus.

    ``id`` is the user's id (``id_field``) or the 0-based row index as a string.
    ``line`` is 1-based: the line in the file for txt/jsonl, the line where the row
    starts for csv/tsv (the header is line 1), the row number for parquet.
    """

    id: str
    text: str
    line: int


@dataclass
class CorpusStats:
    """Counts gathered while a corpus streams by."""

    n: int = 0
    empty: int = 0  # empty or whitespace-only texts, kept as records

    def warnings(self) -> list[str]:
        out: list[str] = []
        if self.empty:
            verb = "is" if self.empty == 1 else "are"
            out.append(
                f"{self.empty:,} of {self.n:,} texts {verb} empty or whitespace-only "
                "(kept as empty rows so rows stay aligned)"
            )
        return out


# --------------------------------------------------------------------------- public


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


def iter_corpus(
    source: str | os.PathLike[str],
    *,
    text_field: str | None = None,
    column: str | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    stats: CorpusStats | None = None,
) -> Iterator[Record]:
    """Stream the records of a corpus file (or ``-`` for stdin).

    Cheap checks (the file exists, its format is known, the options fit it) run now
    and raise ``InputError`` at once; problems inside the file are raised while
    iterating, at the first bad line. ``text_field`` and ``column`` are aliases.
    ``stats`` (if given) is updated as records are yielded.
    """
    field = _resolve_field(text_field, column)
    name = str(source)
    if name.startswith("hf:"):  # a Hugging Face dataset (runtime/hf_dataset.py)
        from layerscope.runtime.hf_dataset import dataset_rows

        rows, name = dataset_rows(name, field, id_field)
        return _records(rows, name, id_field, stats if stats is not None else CorpusStats())
    if name == "-":
        name = _STDIN_NAME
        fmt = _resolve_stdin_fmt(fmt)
        _check_options(name, fmt, field, id_field)
        stream = _stdin_bytes()
        rows = _rows_from_lines(fmt, _decoded_lines(stream, name), name, field, id_field)
    else:
        path = Path(source).expanduser()
        _check_path(path, name)
        fmt = _resolve_file_fmt(fmt, source)
        _check_options(name, fmt, field, id_field)
        if path.is_file() and _is_empty_file(path):
            raise InputError(f"{name} is empty: nothing to extract")
        if fmt == "parquet":
            if importlib.util.find_spec("pyarrow") is None:
                raise MissingExtraError("pyarrow", "parquet")
            rows = _parquet_rows(path, name, field or _DEFAULT_FIELD, id_field)
        else:
            rows = _file_rows(path, name, fmt, field, id_field)
    return _records(rows, name, id_field, stats if stats is not None else CorpusStats())


def read_corpus(
    source: str | os.PathLike[str],
    *,
    text_field: str | None = None,
    column: str | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    stats: CorpusStats | None = None,
) -> tuple[list[Record], CorpusStats]:
    """All records of a (small) corpus at once, with their stats."""
    stats = stats if stats is not None else CorpusStats()
    records = list(
        iter_corpus(
            source, text_field=text_field, column=column, id_field=id_field, fmt=fmt,
            stats=stats,
        )
    )
    return records, stats


# ------------------------------------------------------------------ option checks


def _resolve_field(text_field: str | None, column: str | None) -> str | None:
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


def _resolve_stdin_fmt(fmt: str | None) -> str:
    key = "txt" if fmt is None else _normalize_fmt(fmt)
    if key == "stdin":
        key = "txt"
    if key == "parquet":
        raise InputError(
            "parquet cannot be read from stdin; save it to a file and pass its path"
        )
    return key


def _resolve_file_fmt(fmt: str | None, source: str | os.PathLike[str]) -> str:
    if fmt is None:
        return detect_format(source)
    key = _normalize_fmt(fmt)
    if key == "stdin":
        raise InputError(f"format 'stdin' is only for the source '-', not for the file {source}")
    return key


def _check_options(name: str, fmt: str, field: str | None, id_field: str | None) -> None:
    if fmt != "txt":
        if id_field is not None and not id_field:
            raise InputError("the id field/column name is empty; pass a name or leave it unset")
        return
    if field is not None and field != _DEFAULT_FIELD:
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


def _check_path(path: Path, name: str) -> None:
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


def _is_empty_file(path: Path) -> bool:
    """True for a 0-byte file or one holding only a UTF-8 BOM."""
    size = path.stat().st_size
    if size > len(_BOM):
        return False
    try:
        return path.read_bytes() in (b"", _BOM)
    except OSError:
        return False  # reported with its reason when the file is opened


def _looks_supported(path: Path) -> bool:
    try:
        detect_format(path)
    except InputError:
        return False
    return True


# ----------------------------------------------------------------- record stream


def _records(
    rows: Iterable[tuple[str, str | None, int]],
    name: str,
    id_field: str | None,
    stats: CorpusStats,
) -> Iterator[Record]:
    """Number the rows, check ids, count empties; the shared tail of every reader."""
    seen: dict[str, int] = {}
    n = 0
    empty = 0
    for text, rid, line in rows:
        if id_field is None:
            rid = str(n)
        else:
            first = seen.setdefault(rid, line)
            if first != line:
                raise InputError(
                    f"{name}: id {rid!r} appears on line {first} and again on line {line}; "
                    f"ids in {id_field!r} must be unique"
                )
        n += 1
        stats.n += 1
        if not text.strip():
            empty += 1
            stats.empty += 1
        yield Record(rid, text, line)
    if n == 0:
        raise InputError(f"{name} has no records: nothing to extract")
    if empty == n:
        raise InputError(
            f"{name} holds only empty or whitespace-only texts ({n:,} of {n:,}): "
            "nothing to extract"
        )


# ------------------------------------------------------------------ byte sources


def _stdin_bytes() -> Iterator[bytes]:
    stdin = sys.stdin
    if stdin is None:
        raise InputError("stdin is closed; pass a corpus file instead of -")
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if stdin.isatty():
            raise InputError(
                "reading texts from stdin (-), but stdin is a terminal; pipe texts in "
                "(e.g. cat corpus.txt | ...) or pass a file"
            )
    buffer = getattr(stdin, "buffer", None)
    if buffer is not None:
        return iter(buffer)
    # A text-only stdin (e.g. replaced by io.StringIO): get back to bytes.
    return (line.encode("utf-8", "surrogateescape") for line in stdin)


@contextlib.contextmanager
def _open_bytes(path: Path, name: str) -> Iterator[BinaryIO]:
    """The file's bytes, gunzipped when it starts with the gzip magic number."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from exc
    with fh:
        if fh.peek(2)[:2] == _GZIP_MAGIC:
            with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                yield gz  # type: ignore[misc]
        else:
            yield fh


def _decoded_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line with its ending) for each line.

    Lines are split on ``\\n`` only, so ``\\r``, form feeds and Unicode line
    separators stay inside a text. A UTF-8 BOM at the start is dropped; the first
    byte that is not UTF-8 stops the read with its line and column.
    """
    it = iter(raw_lines)
    lineno = 0
    while True:
        try:
            raw = next(it)
        except StopIteration:
            return
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise InputError(
                f"{name} is a damaged or truncated gzip file (after line {lineno}: {exc}); "
                "re-create or re-download it"
            ) from exc
        except OSError as exc:
            raise InputError(f"cannot read {name} after line {lineno}: {exc}") from exc
        lineno += 1
        skipped = 0
        if lineno == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
            skipped = len(_BOM)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(_utf8_message(name, lineno, raw, exc, skipped)) from exc
        yield lineno, text


def _utf8_message(name: str, lineno: int, raw: bytes, exc: UnicodeDecodeError, skipped: int) -> str:
    bad = raw[exc.start]
    column = exc.start + 1 + skipped
    source = "utf-16" if lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff") else "latin1"
    return (
        f"{name} line {lineno} is not valid UTF-8 (byte 0x{bad:02x} at column {column}); "
        f"re-encode the file as UTF-8 (e.g. iconv -f {source} -t utf-8)"
    )


def _strip_ending(line: str) -> str:
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith("\n"):
        return line[:-1]
    return line


# --------------------------------------------------------------- format readers


def _file_rows(
    path: Path, name: str, fmt: str, field: str | None, id_field: str | None
) -> Iterator[tuple[str, str | None, int]]:
    with _open_bytes(path, name) as fh:
        yield from _rows_from_lines(fmt, _decoded_lines(fh, name), name, field, id_field)


def _rows_from_lines(
    fmt: str,
    lines: Iterator[tuple[int, str]],
    name: str,
    field: str | None,
    id_field: str | None,
) -> Iterator[tuple[str, str | None, int]]:
    if fmt == "txt":
        return _txt_rows(lines)
    if fmt == "jsonl":
        return _jsonl_rows(lines, name, field or _DEFAULT_FIELD, id_field)
    return _csv_rows(lines, name, field or _DEFAULT_FIELD, id_field, tsv=(fmt == "tsv"))


def _txt_rows(lines: Iterator[tuple[int, str]]) -> Iterator[tuple[str, str | None, int]]:
    for lineno, line in lines:
        yield _strip_ending(line), None, lineno


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _list_names(names: Iterable[str]) -> str:
    names = list(names)
    if not names:
        return "none"
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    if len(names) > _MAX_LISTED:
        shown += f", ... ({len(names)} in all)"
    return shown


def _jsonl_rows(
    lines: Iterator[tuple[int, str]], name: str, field: str, id_field: str | None
) -> Iterator[tuple[str, str | None, int]]:
    for lineno, line in lines:
        where = f"{name} line {lineno}"
        if not line.strip():
            raise InputError(
                f"{where} is blank; every line of a JSON Lines file must hold one JSON "
                'object (write {"' + field + '": ""} for an empty text, or remove the line)'
            )
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); each line "
                "must be one complete JSON object"
            ) from exc
        except RecursionError as exc:
            raise InputError(f"{where} is nested too deeply to read as JSON") from exc
        except ValueError as exc:  # e.g. an integer too long to convert
            raise InputError(f"{where} is not valid JSON ({exc})") from exc
        rid: str | None = None
        if isinstance(obj, str):
            if id_field is not None:
                raise InputError(
                    f"{where} is a bare JSON string, so it has no id field {id_field!r}; "
                    "write each line as an object with the text and the id"
                )
            text = obj
        elif isinstance(obj, dict):
            if field not in obj:
                raise InputError(
                    f"{where} has no field {field!r} (its fields: {_list_names(obj)}); "
                    "choose the text field with --text-field"
                )
            text = obj[field]
            if not isinstance(text, str):
                fix = ' (write "" for an empty text)' if text is None else ""
                raise InputError(
                    f"{where}: field {field!r} is {_kind(text)}, not a string; every "
                    f"text must be a JSON string{fix}"
                )
            if id_field is not None:
                if id_field not in obj:
                    raise InputError(
                        f"{where} has no id field {id_field!r} (its fields: "
                        f"{_list_names(obj)}); every line needs an id, or leave the id "
                        "field unset"
                    )
                value = obj[id_field]
                if isinstance(value, bool) or not isinstance(value, (str, int)):
                    raise InputError(
                        f"{where}: id field {id_field!r} is {_kind(value)}; ids must be "
                        "strings or integers"
                    )
                rid = str(value)
                if not rid:
                    raise InputError(
                        f"{where}: id field {id_field!r} is an empty string; give every line an id"
                    )
        else:
            raise InputError(
                f"{where} is {_kind(obj)}, not a JSON object or string; write each line "
                f'as {{"{field}": "..."}}'
            )
        if "\\u" in line:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InputError(
                    f"{where}: the text holds a lone surrogate escape "
                    f"(\\u{ord(text[exc.start]):04x}) that is not a character; fix the "
                    "escape or drop it"
                ) from exc
        yield text, rid, lineno


def _csv_rows(
    lines: Iterator[tuple[int, str]],
    name: str,
    column: str,
    id_field: str | None,
    *,
    tsv: bool,
) -> Iterator[tuple[str, str | None, int]]:
    kind = "TSV" if tsv else "CSV"
    # Long documents are normal here; the csv module's default cap is 128 KiB a field.
    if csv.field_size_limit() < 2**31 - 1:
        csv.field_size_limit(2**31 - 1)
    if tsv:
        reader = csv.reader((t for _, t in lines), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader((t for _, t in lines), strict=True)

    def read_row(start: int) -> list[str] | None:
        try:
            return next(reader)
        except StopIteration:
            return None
        except csv.Error as exc:
            where = f"line {reader.line_num}"
            if reader.line_num != start:
                where += f" (in the row starting on line {start})"
            if "unexpected end of data" in str(exc):
                raise InputError(
                    f"{name}: a quoted field starting on line {start} is never closed; "
                    'check the quotes on that line (a " inside a field is written "")'
                ) from exc
            raise InputError(
                f"{name} {where} is not valid {kind} ({exc}); fields holding commas, "
                'quotes or line breaks must be wrapped in "..." with inner quotes doubled'
            ) from exc

    header = read_row(1)
    if header is None:
        raise InputError(f"{name} is empty: nothing to extract")
    if not header:
        raise InputError(
            f"{name} line 1 is blank; the first line must be the header with the column names"
        )
    header_end = reader.line_num
    text_idx = _column_index(name, header, column, "text", "--column", kind, tsv)
    id_idx = None
    if id_field is not None:
        id_idx = _column_index(name, header, id_field, "id", "--id-column", kind, tsv)
    ncols = len(header)

    prev_end = header_end
    found_rows = False
    while True:
        start = prev_end + 1
        row = read_row(start)
        if row is None:
            break
        prev_end = reader.line_num
        found_rows = True
        if len(row) != ncols:
            if not row and ncols == 1:
                row = [""]  # a blank line in a one-column file is an empty text
            elif not row:
                raise InputError(
                    f"{name} line {start} is blank but the header has {ncols} columns; "
                    "remove the blank line or fill in the row"
                )
            else:
                sep = "tabs" if tsv else "commas"
                fix = (
                    "a TSV field cannot hold a tab; replace tabs inside texts"
                    if tsv
                    else 'wrap fields that hold commas in "..."'
                )
                raise InputError(
                    f"{name} line {start} has {len(row)} fields but the header has "
                    f"{ncols} columns; {fix} (fields are split on {sep})"
                )
        rid = None
        if id_idx is not None:
            rid = row[id_idx]
            if not rid:
                raise InputError(
                    f"{name} line {start}: the id column {id_field!r} is empty; give "
                    "every row an id"
                )
        yield row[text_idx], rid, start
    if not found_rows:
        raise InputError(f"{name} has a header but no rows: nothing to extract")


def _column_index(
    name: str, header: list[str], column: str, role: str, option: str, kind: str, tsv: bool
) -> int:
    count = header.count(column)
    if count == 1:
        return header.index(column)
    if count > 1:
        raise InputError(
            f"{name}: column {column!r} appears {count} times in the header; rename the "
            "duplicates so the column is unambiguous"
        )
    hint = ""
    if len(header) == 1:
        other = {",": "CSV", "\t": "TSV", ";": "semicolon-separated"}
        for sep, label in other.items():
            if sep in header[0] and not (sep == "\t" and tsv) and not (sep == "," and not tsv):
                hint = f"; the header is one column holding {sep!r}: is this a {label} file?"
                break
    raise InputError(
        f"{name} has no {role} column {column!r} (columns: {_list_names(header)}; the "
        f"first line is read as the header); choose the {role} column with {option}{hint}"
    )


def _parquet_rows(
    path: Path, name: str, column: str, id_field: str | None
) -> Iterator[tuple[str, str | None, int]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtraError("pyarrow", "parquet") from exc

    def is_string(t: object) -> bool:
        if pa.types.is_dictionary(t):
            t = t.value_type
        is_view = getattr(pa.types, "is_string_view", None)
        return bool(
            pa.types.is_string(t) or pa.types.is_large_string(t) or (is_view and is_view(t))
        )

    try:
        pf = pq.ParquetFile(str(path))
    except (pa.ArrowException, OSError) as exc:
        raise InputError(
            f"{name} is not a readable Parquet file ({exc}); check that it was fully "
            "written, or pass fmt to read it as another format"
        ) from exc
    with pf:
        schema = pf.schema_arrow
        names = list(schema.names)
        for col, role, option in ((column, "text", "--column"), (id_field, "id", "--id-column")):
            if col is None:
                continue
            if col not in names:
                raise InputError(
                    f"{name} has no {role} column {col!r} (columns: {_list_names(names)}); "
                    f"choose the {role} column with {option}"
                )
        text_type = schema.field(column).type
        if not is_string(text_type):
            raise InputError(
                f"{name}: column {column!r} holds {text_type}, not strings; choose the "
                "column with the texts (--column)"
            )
        if id_field is not None:
            id_type = schema.field(id_field).type
            if not (is_string(id_type) or pa.types.is_integer(id_type)):
                raise InputError(
                    f"{name}: id column {id_field!r} holds {id_type}; ids must be strings "
                    "or integers"
                )
        if pf.metadata.num_rows == 0:
            raise InputError(f"{name} has no rows: nothing to extract")

        wanted = [column] if id_field in (None, column) else [column, id_field]
        row = 0
        try:
            batches = pf.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=wanted)
            for batch in batches:
                texts = batch.column(0).to_pylist()
                ids = batch.column(wanted.index(id_field)).to_pylist() if id_field else None
                for i, text in enumerate(texts):
                    number = row + i + 1
                    if text is None:
                        raise InputError(
                            f"{name} row {number}: column {column!r} is null; every text "
                            'must be a string (use "" for an empty text)'
                        )
                    rid = None
                    if ids is not None:
                        value = ids[i]
                        if value is None or value == "":
                            raise InputError(
                                f"{name} row {number}: the id column {id_field!r} is "
                                f"{'null' if value is None else 'empty'}; give every row an id"
                            )
                        rid = str(value)
                    yield text, rid, number
                row += len(texts)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{name}: cannot read rows after row {row} ({exc})") from exc
