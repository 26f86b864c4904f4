"""Parquet corpora, read record batch by record batch with pyarrow (imported only here, when needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from layerscope.data.corpus_lines import list_names
from layerscope.errors import InputError, MissingExtraError

_PARQUET_BATCH_ROWS = 2048


def parquet_rows(
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
                    f"{name} has no {role} column {col!r} (columns: {list_names(names)}); "
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
