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

This module is the entry point (``iter_corpus``, ``read_corpus``) and the shared tail
(ids, empties, counts); each format has its own module: ``corpus_detect`` (names,
formats, option checks), ``corpus_lines`` (bytes, gzip, stdin, UTF-8, plain text),
``corpus_jsonl``, ``corpus_csv`` (CSV and TSV) and ``corpus_parquet``.

Readers stream: the file is read line by line (or batch by batch), so memory does
not grow with the corpus. Only the ids seen so far are kept, to catch duplicates.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from layerscope.data.corpus_csv import csv_rows
from layerscope.data.corpus_detect import (DEFAULT_FIELD, check_options, check_path, detect_format,
                                           is_empty_file, resolve_field, resolve_file_fmt, resolve_stdin_fmt)
from layerscope.data.corpus_jsonl import jsonl_rows
from layerscope.data.corpus_lines import bounded_lines, decoded_lines, open_bytes, stdin_bytes, txt_rows
from layerscope.data.corpus_parquet import parquet_rows
from layerscope.errors import InputError, MissingExtraError

__all__ = ["Record", "CorpusStats", "iter_corpus", "read_corpus", "records_of", "detect_format"]

_STDIN_NAME = "stdin"


@dataclass(frozen=True, slots=True)
class Record:
    """One text of the corpus.

    ``id`` is the user's id (``id_field``; in a .jsonl file the field ``id`` when the first line has one)
    or the 0-based row index as a string.
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
    id_field: str | None = None  # the field or column the ids came from; None: rows numbered 0, 1, 2, ...

    def ids_line(self) -> str:
        """Where the ids came from, for the console."""
        if self.id_field is None:
            return "ids: row numbers 0, 1, 2, ... (no id field; --id-field names one)"
        return f"ids: from the field {self.id_field!r}"

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
    field = resolve_field(text_field, column)
    name = str(source)
    stats = stats if stats is not None else CorpusStats()
    stats.id_field = id_field
    if name.startswith("hf:"):  # a Hugging Face dataset (data/hf_dataset.py)
        from layerscope.data.hf_dataset import dataset_rows

        rows, name = dataset_rows(name, field, id_field)
        return _records(rows, name, stats)
    if name == "-":
        name = _STDIN_NAME
        fmt = resolve_stdin_fmt(fmt)
        check_options(name, fmt, field, id_field)
        stream = stdin_bytes()
        rows = _rows_from_lines(fmt, decoded_lines(stream, name), name, field, id_field, stats)
    else:
        path = Path(source).expanduser()
        check_path(path, name)
        fmt = resolve_file_fmt(fmt, source)
        check_options(name, fmt, field, id_field)
        if path.is_file() and is_empty_file(path):
            raise InputError(f"{name} is empty: nothing to extract")
        if fmt == "parquet":
            if importlib.util.find_spec("pyarrow") is None:
                raise MissingExtraError("pyarrow", "parquet")
            rows = parquet_rows(path, name, field or DEFAULT_FIELD, id_field)
        else:
            rows = _file_rows(path, name, fmt, field, id_field, stats)
    return _records(rows, name, stats)


def read_corpus(
    source: str | os.PathLike[str], *, stats: CorpusStats | None = None, **options: str | None
) -> tuple[list[Record], CorpusStats]:
    """All records of a (small) corpus at once, with their stats; ``options`` are ``iter_corpus``'s
    (``text_field``, ``column``, ``id_field``, ``fmt``)."""
    stats = stats if stats is not None else CorpusStats()
    return list(iter_corpus(source, stats=stats, **options)), stats


def records_of(
    source,
    *,
    text_field: str | None = None,
    column: str | None = None,
    id_field: str | None = None,
    fmt: str | None = None,
    stats: CorpusStats | None = None,
) -> Iterator[Record]:
    """Records of anything an extraction reads: a corpus file or ``-`` (read by ``iter_corpus``), a
    Hugging Face ``Dataset`` (its ``text_field`` column, default ``"text"``), or a list or any other
    iterable of strings (``stats``, where given, is filled as a file streams by). In-memory texts get ids
    ``0, 1, 2, ...``; a text that is not a string, or no
    texts at all, is an ``InputError`` when the stream reaches it.
    """
    if isinstance(source, (str, os.PathLike)):
        return iter_corpus(source, text_field=text_field, column=column, id_field=id_field, fmt=fmt, stats=stats)
    field = text_field or DEFAULT_FIELD
    if hasattr(source, "column_names"):  # a Hugging Face dataset: its text column, ids by row
        if field not in source.column_names:
            raise InputError(f"the dataset has no column '{field}' (it has {', '.join(source.column_names)}); "
                             "name one with text_field=")
        source = source[field] if len(source) < 1_000_000 else (row[field] for row in source)
    return _in_memory(source)


def _in_memory(texts: Iterable) -> Iterator[Record]:
    i = -1
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"text {i} is a {type(text).__name__}, not a string")
        yield Record(str(i), text, i + 1)
    if i < 0:
        raise InputError("no texts given: nothing to extract")


# ----------------------------------------------------------------- record stream


def _records(
    rows: Iterable[tuple[str, str | None, int]],
    name: str,
    stats: CorpusStats,
) -> Iterator[Record]:
    """Number the rows that hold no id, check ids, count empties; the shared tail of every reader."""
    seen: dict[str, int] = {}
    n = 0
    empty = 0
    for text, rid, line in rows:
        if rid is None:
            rid = str(n)
        else:
            first = seen.setdefault(rid, line)
            if first != line:
                raise InputError(
                    f"{name}: id {rid!r} appears on line {first} and again on line {line}; "
                    f"ids in {stats.id_field!r} must be unique"
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


def _file_rows(
    path: Path, name: str, fmt: str, field: str | None, id_field: str | None, stats: CorpusStats
) -> Iterator[tuple[str, str | None, int]]:
    with open_bytes(path, name) as fh:
        yield from _rows_from_lines(fmt, decoded_lines(bounded_lines(fh), name), name, field, id_field, stats)


def _rows_from_lines(
    fmt: str,
    lines: Iterator[tuple[int, str]],
    name: str,
    field: str | None,
    id_field: str | None,
    stats: CorpusStats,
) -> Iterator[tuple[str, str | None, int]]:
    if fmt == "txt":
        return txt_rows(lines)
    if fmt == "jsonl":
        return jsonl_rows(lines, name, field or DEFAULT_FIELD, id_field,
                          on_id_field=lambda f: setattr(stats, "id_field", f))
    return csv_rows(lines, name, field or DEFAULT_FIELD, id_field, tsv=(fmt == "tsv"))
