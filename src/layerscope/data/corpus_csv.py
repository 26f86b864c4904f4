"""CSV and TSV corpora: a header row, then one text per row (CSV quoted as usual, TSV without quoting)."""

from __future__ import annotations

import csv
from collections.abc import Iterator

from layerscope.data.corpus_lines import list_names
from layerscope.errors import InputError


def csv_rows(
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
        f"{name} has no {role} column {column!r} (columns: {list_names(header)}; the "
        f"first line is read as the header); choose the {role} column with {option}{hint}"
    )
