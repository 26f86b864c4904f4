"""Tests for layerscope.data.corpus: every format, every bad input, streaming."""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import io
import sys
from pathlib import Path

import pytest

from layerscope.errors import InputError, MissingExtraError
from layerscope.data.corpus import (
    CorpusStats,
    Record,
    detect_format,
    iter_corpus,
    read_corpus,
)


def write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def write_gz(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with gzip.open(path, "wb") as fh:
        fh.write(raw)
    return path


def error_of(source, **kwargs) -> str:
    """The one-line message read_corpus raises for this input."""
    with pytest.raises(InputError) as info:
        read_corpus(source, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def texts(records: list[Record]) -> list[str]:
    return [r.text for r in records]


def set_stdin(monkeypatch, data: bytes) -> io.BytesIO:
    raw = io.BytesIO(data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw, encoding="utf-8"))
    return raw


# ------------------------------------------------------------------------- formats


def test_txt_lines_keep_inner_whitespace_and_empty_lines(tmp_path):
    path = write(tmp_path, "corpus.txt", "first text\n  padded\t \n\nlast without newline")
    records, stats = read_corpus(path)
    assert records == [
        Record("0", "first text", 1),
        Record("1", "  padded\t ", 2),
        Record("2", "", 3),
        Record("3", "last without newline", 4),
    ]
    assert (stats.n, stats.empty) == (4, 1)


def test_txt_crlf_endings_are_stripped_but_inner_cr_kept(tmp_path):
    path = write(tmp_path, "corpus.txt", b"alpha\r\nbeta\r\ngam\rma\n  \r\n")
    records, stats = read_corpus(path)
    assert texts(records) == ["alpha", "beta", "gam\rma", "  "]
    assert [r.line for r in records] == [1, 2, 3, 4]
    assert stats.empty == 1


def test_txt_keeps_unicode_line_separators_inside_a_text(tmp_path):
    path = write(tmp_path, "corpus.txt", "a\u2028b\x0cc\x85d\nnext\n")
    records, _ = read_corpus(path)
    assert texts(records) == ["a\u2028b\x0cc\x85d", "next"]


def test_utf8_bom_is_dropped(tmp_path):
    path = write(tmp_path, "corpus.txt", b"\xef\xbb\xbfhello\nworld\n")
    records, _ = read_corpus(path)
    assert texts(records) == ["hello", "world"]


def test_bom_before_csv_header_is_dropped(tmp_path):
    path = write(tmp_path, "corpus.csv", b"\xef\xbb\xbftext,id\r\nhi,a\r\n")
    records, _ = read_corpus(path, id_field="id")
    assert records == [Record("a", "hi", 2)]


def test_jsonl_objects_strings_and_default_field(tmp_path):
    path = write(
        tmp_path,
        "corpus.jsonl",
        '{"text": "one", "label": 3}\n"a bare string"\n{"text": "", "x": null}\r\n{"text": "caf\\u00e9 \\ud83d\\ude00"}\n',
    )
    records, stats = read_corpus(path)
    assert records == [
        Record("0", "one", 1),
        Record("1", "a bare string", 2),
        Record("2", "", 3),
        Record("3", "caf\u00e9 \U0001f600", 4),
    ]
    assert (stats.n, stats.empty) == (4, 1)


def test_jsonl_text_field_and_id_field(tmp_path):
    path = write(
        tmp_path,
        "corpus.ndjson",
        '{"body": "x", "uid": "doc-1"}\n{"body": "y", "uid": 7}\n',
    )
    records, _ = read_corpus(path, text_field="body", id_field="uid")
    assert records == [Record("doc-1", "x", 1), Record("7", "y", 2)]


def test_text_field_and_column_are_aliases(tmp_path):
    jsonl = write(tmp_path, "c.jsonl", '{"body": "from json"}\n')
    csv_path = write(tmp_path, "c.csv", "body\nfrom csv\n")
    assert texts(read_corpus(jsonl, column="body")[0]) == ["from json"]
    assert texts(read_corpus(csv_path, text_field="body")[0]) == ["from csv"]
    assert texts(read_corpus(csv_path, text_field="body", column="body")[0]) == ["from csv"]
    message = error_of(csv_path, text_field="body", column="text")
    assert "'body'" in message and "'text'" in message and "only one" in message


def test_csv_quoting_multiline_fields_and_ids(tmp_path):
    path = write(
        tmp_path,
        "corpus.csv",
        'id,text,score\r\n'
        'a,"hello, world",1\r\n'
        'b,"she said ""hi""",2\r\n'
        'c,"two\nlines",3\r\n'
        'd,   ,4\r\n',
    )
    records, stats = read_corpus(path, id_field="id")
    assert records == [
        Record("a", "hello, world", 2),
        Record("b", 'she said "hi"', 3),
        Record("c", "two\nlines", 4),
        Record("d", "   ", 6),  # the row after the two-line field starts on line 6
    ]
    assert stats.empty == 1


def test_csv_custom_column(tmp_path):
    path = write(tmp_path, "corpus.csv", "sentence,label\nthe cat,1\nthe dog,0\n")
    records, _ = read_corpus(path, column="sentence")
    assert records == [Record("0", "the cat", 2), Record("1", "the dog", 3)]


def test_csv_blank_line_in_one_column_file_is_an_empty_text(tmp_path):
    path = write(tmp_path, "corpus.csv", 'text\nfirst\n\n""\nlast\n')
    records, stats = read_corpus(path)
    assert texts(records) == ["first", "", "", "last"]
    assert [r.line for r in records] == [2, 3, 4, 5]
    assert stats.empty == 2


def test_tsv_keeps_quotes_literally(tmp_path):
    path = write(tmp_path, "corpus.tsv", 'id\ttext\nq1\t"quoted" and 5\'7"\nq2\tplain, with comma\n')
    records, _ = read_corpus(path, id_field="id")
    assert records == [
        Record("q1", '"quoted" and 5\'7"', 2),
        Record("q2", "plain, with comma", 3),
    ]


def test_parquet_reads_text_and_id_columns_across_batches(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 5000  # more than one record batch and several row groups
    table = pa.table(
        {
            "doc": [f"text {i}" if i % 1000 else "" for i in range(n)],
            "key": list(range(100, 100 + n)),
            "other": [1.5] * n,
        }
    )
    path = tmp_path / "corpus.parquet"
    pq.write_table(table, path, row_group_size=1500)
    records, stats = read_corpus(path, column="doc", id_field="key")
    assert len(records) == n
    assert records[0] == Record("100", "", 1)
    assert records[1] == Record("101", "text 1", 2)
    assert records[-1] == Record(str(100 + n - 1), f"text {n - 1}", n)
    assert (stats.n, stats.empty) == (n, 5)


def test_parquet_default_column_and_dictionary_strings(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": pa.array(["a", "b", "a"]).dictionary_encode()})
    path = tmp_path / "corpus.parquet"
    pq.write_table(table, path)
    records, _ = read_corpus(path)
    assert records == [Record("0", "a", 1), Record("1", "b", 2), Record("2", "a", 3)]


def test_stdin_is_read_as_text_lines(monkeypatch):
    set_stdin(monkeypatch, b"\xef\xbb\xbfone\r\ntwo\n\nthree")
    records, stats = read_corpus("-")
    assert records == [
        Record("0", "one", 1),
        Record("1", "two", 2),
        Record("2", "", 3),
        Record("3", "three", 4),
    ]
    assert stats.empty == 1


def test_stdin_with_format_override(monkeypatch):
    set_stdin(monkeypatch, b'{"text": "a", "id": "x"}\n{"text": "b", "id": "y"}\n')
    records, _ = read_corpus("-", fmt="jsonl", id_field="id")
    assert records == [Record("x", "a", 1), Record("y", "b", 2)]


def test_stdin_bad_utf8_names_stdin(monkeypatch):
    set_stdin(monkeypatch, b"ok\nbad \xe9\n")
    assert error_of("-") == (
        "stdin line 2 is not valid UTF-8 (byte 0xe9 at column 5); "
        "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    )


def test_stdin_terminal_is_refused(monkeypatch):
    class Tty(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty(io.BytesIO(b""), encoding="utf-8"))
    message = error_of("-")
    assert "stdin is a terminal" in message and "pipe" in message


def test_stdin_refuses_parquet(monkeypatch):
    set_stdin(monkeypatch, b"")
    assert "parquet cannot be read from stdin" in error_of("-", fmt="parquet")


@pytest.mark.parametrize(
    ("name", "data", "kwargs", "expected"),
    [
        ("c.txt.gz", "a\r\nb\n", {}, [("0", "a", 1), ("1", "b", 2)]),
        ("c.jsonl.gz", '{"text": "a", "i": "k"}\n', {"id_field": "i"}, [("k", "a", 1)]),
        ("c.csv.gz", 'text\n"x, y"\n', {}, [("0", "x, y", 2)]),
        ("c.tsv.gz", 'text\n"q"\n', {}, [("0", '"q"', 2)]),
    ],
)
def test_gzipped_text_formats(tmp_path, name, data, kwargs, expected):
    path = write_gz(tmp_path, name, data)
    records, _ = read_corpus(path, **kwargs)
    assert [(r.id, r.text, r.line) for r in records] == expected


def test_format_override_for_unknown_extension_and_gzip_content(tmp_path):
    plain = write(tmp_path, "corpus.data", '{"text": "hi"}\n')
    assert texts(read_corpus(plain, fmt="jsonl")[0]) == ["hi"]
    assert texts(read_corpus(plain, fmt=".ndjson")[0]) == ["hi"]
    zipped = write_gz(tmp_path, "corpus.bin", "text\nhello\n")
    assert texts(read_corpus(zipped, fmt="csv")[0]) == ["hello"]
    # fmt beats the extension: a .txt read as csv
    as_csv = write(tmp_path, "table.txt", "text,n\nrow,1\n")
    assert texts(read_corpus(as_csv, fmt="csv")[0]) == ["row"]


@pytest.mark.parametrize(
    ("source", "fmt"),
    [
        ("a.txt", "txt"),
        ("dir/a.TXT", "txt"),
        ("a.jsonl", "jsonl"),
        ("a.ndjson", "jsonl"),
        ("a.csv", "csv"),
        ("a.tsv", "tsv"),
        ("a.parquet", "parquet"),
        ("a.v2.jsonl.gz", "jsonl"),
        ("a.csv.GZ", "csv"),
        ("a.tsv.gz", "tsv"),
        ("a.txt.gz", "txt"),
        ("-", "stdin"),
        (Path("x/y.csv"), "csv"),
    ],
)
def test_detect_format(source, fmt):
    assert detect_format(source) == fmt


def test_iter_corpus_streams_before_reading_the_whole_file(tmp_path):
    # A big file whose very last line is broken: the first record arrives at
    # once, and the error only when the reader gets to the end.
    path = tmp_path / "big.txt"
    with open(path, "wb") as fh:
        for i in range(200_000):
            fh.write(b"line number %d with some padding text\n" % i)
        fh.write(b"broken \xff\n")
    stream = iter_corpus(path)
    assert inspect.isgenerator(stream)
    assert next(stream) == Record("0", "line number 0 with some padding text", 1)
    assert next(stream).text == "line number 1 with some padding text"
    with pytest.raises(InputError, match=r"line 200001 is not valid UTF-8"):
        for _ in stream:
            pass


@pytest.mark.parametrize(
    ("name", "head", "row", "tail"),
    [
        ("big.jsonl", "", '{"text": "t"}\n', "{broken\n"),
        ("big.csv", "text\n", "t\n", '"never closed\n'),
        ("big.tsv", "text\n", "t\n", "a\tb\n"),
    ],
)
def test_structured_readers_stream_too(tmp_path, name, head, row, tail):
    path = write(tmp_path, name, head + row * 100_000 + tail)
    stream = iter_corpus(path)
    first = next(stream)
    assert first.text == "t" and first.id == "0"
    with pytest.raises(InputError, match=r"line 10000[12]"):
        list(stream)


def test_stdin_is_consumed_lazily(monkeypatch):
    data = b"".join(b"text %d\n" % i for i in range(100_000))
    raw = set_stdin(monkeypatch, data)
    stream = iter_corpus("-")
    assert raw.tell() == 0  # nothing read before iteration starts
    assert next(stream).text == "text 0"
    assert raw.tell() < len(data)
    assert sum(1 for _ in stream) == 99_999


def test_parquet_streams_batch_by_batch(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 10_000
    values = [f"t{i}" for i in range(n - 1)] + [None]
    pq.write_table(pa.table({"text": values}), tmp_path / "c.parquet", row_group_size=1000)
    stream = iter_corpus(tmp_path / "c.parquet")
    assert next(stream) == Record("0", "t0", 1)
    with pytest.raises(InputError, match=rf"row {n}: column 'text' is null"):
        list(stream)


def test_stats_accumulate_and_warning_text(tmp_path):
    lines = ["text"] * 997 + ["", "   ", "\t"]
    path = write(tmp_path, "corpus.txt", "\n".join(lines) + "\n")
    stats = CorpusStats()
    records = list(iter_corpus(path, stats=stats))
    assert len(records) == 1000
    assert (stats.n, stats.empty) == (1000, 3)
    assert stats.warnings() == [
        "3 of 1,000 texts are empty or whitespace-only (kept as empty rows so rows stay aligned)"
    ]


def test_warning_wording_for_one_and_none():
    assert CorpusStats(n=5, empty=1).warnings() == [
        "1 of 5 texts is empty or whitespace-only (kept as empty rows so rows stay aligned)"
    ]
    assert CorpusStats(n=5, empty=0).warnings() == []


def test_record_is_frozen():
    record = Record("0", "t", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.text = "other"  # type: ignore[misc]


# -------------------------------------------------------------------- path errors


def test_missing_file(tmp_path):
    path = tmp_path / "nope.txt"
    message = error_of(path)
    assert message == f"{path} does not exist; check the path"


def test_missing_relative_file_names_the_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = error_of("nope.jsonl")
    assert message.startswith("nope.jsonl does not exist (relative to ")
    assert str(tmp_path) in message


def test_directory_is_refused_and_its_corpus_files_listed(tmp_path):
    write(tmp_path, "a.jsonl", '{"text": "x"}\n')
    write(tmp_path, "notes.md", "hi")
    message = error_of(tmp_path)
    assert message == f"{tmp_path} is a directory; pass a corpus file inside it (it holds: a.jsonl)"


def test_unknown_extension_lists_supported_and_fmt(tmp_path):
    path = write(tmp_path, "corpus.docx", "x")
    message = error_of(path)
    assert "corpus.docx: unknown corpus file type .docx" in message
    for ext in (".txt", ".jsonl", ".ndjson", ".csv", ".tsv", ".parquet", ".jsonl.gz"):
        assert ext in message
    assert "fmt=" in message


def test_json_extension_gets_a_jsonl_hint(tmp_path):
    path = write(tmp_path, "corpus.json", '[{"text": "x"}]')
    message = error_of(path)
    assert "unknown corpus file type .json" in message and "name it .jsonl" in message


def test_unknown_fmt_value(tmp_path):
    path = write(tmp_path, "c.txt", "x\n")
    assert error_of(path, fmt="xlsx") == (
        "unknown corpus format 'xlsx'; choose one of: txt, jsonl, csv, tsv, parquet"
    )


def test_gzipped_parquet_is_refused():
    with pytest.raises(InputError, match="gzipped parquet file is not supported"):
        detect_format("a.parquet.gz")


def test_txt_refuses_id_and_text_field_options(tmp_path):
    path = write(tmp_path, "corpus.txt", "x\n")
    message = error_of(path, id_field="id")
    assert message.startswith(f"{path} is read as plain text") and "'id'" in message
    message = error_of(path, column="body")
    assert "'body' does not apply" in message
    assert texts(read_corpus(path, column="text")[0]) == ["x"]  # the default is harmless


# ---------------------------------------------------------------- empty inputs


@pytest.mark.parametrize("name", ["corpus.txt", "corpus.jsonl", "corpus.csv", "corpus.tsv", "corpus.parquet"])
def test_empty_file(tmp_path, name):
    path = write(tmp_path, name, b"")
    assert error_of(path) == f"{path} is empty: nothing to extract"


def test_empty_gzip_and_bom_only(tmp_path):
    zipped = write_gz(tmp_path, "corpus.txt.gz", b"")
    assert error_of(zipped) == f"{zipped} has no records: nothing to extract"
    bom = write(tmp_path, "bom.csv", b"\xef\xbb\xbf")
    assert error_of(bom) == f"{bom} is empty: nothing to extract"


def test_csv_with_only_a_header(tmp_path):
    path = write(tmp_path, "corpus.csv", "id,text\n")
    assert error_of(path) == f"{path} has a header but no rows: nothing to extract"


def test_all_texts_empty(tmp_path):
    path = write(tmp_path, "corpus.txt", "\n  \n")
    assert error_of(path) == (
        f"{path} holds only empty or whitespace-only texts (2 of 2): nothing to extract"
    )


def test_parquet_without_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), path)
    assert error_of(path) == f"{path} has no rows: nothing to extract"


# ----------------------------------------------------------------- bad encoding


def test_bad_utf8_names_line_byte_and_column(tmp_path):
    path = write(tmp_path, "corpus.txt", b"fine\nalso fine\ncaf\xc3\xa9 \xff bad\nnever read\n")
    assert error_of(path) == (
        f"{path} line 3 is not valid UTF-8 (byte 0xff at column 7); "
        "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
    )


def test_bad_utf8_column_counts_the_bom(tmp_path):
    path = write(tmp_path, "corpus.txt", b"\xef\xbb\xbfab\xe9\n")
    assert "line 1 is not valid UTF-8 (byte 0xe9 at column 6)" in error_of(path)


def test_utf16_file_gets_a_utf16_hint(tmp_path):
    path = write(tmp_path, "corpus.txt", "hello\n".encode("utf-16"))
    message = error_of(path)
    assert "line 1 is not valid UTF-8 (byte 0xff at column 1)" in message
    assert "iconv -f utf-16 -t utf-8" in message


@pytest.mark.parametrize(
    ("name", "data", "line"),
    [
        ("corpus.jsonl", b'{"text": "a"}\n{"text": "\xe9"}\n', 2),
        ("corpus.csv", b"text\nok\n\"multi\nline \x80\"\n", 4),
        ("corpus.tsv", b"text\nok\nok\n\xfe\n", 4),
    ],
)
def test_bad_utf8_in_structured_formats(tmp_path, name, data, line):
    path = write(tmp_path, name, data)
    message = error_of(path)
    assert message.startswith(f"{path} line {line} is not valid UTF-8 (byte 0x")


def test_bad_utf8_inside_gzip(tmp_path):
    path = write_gz(tmp_path, "corpus.txt.gz", b"ok\n\x92quote\n")
    assert error_of(path).startswith(f"{path} line 2 is not valid UTF-8 (byte 0x92 at column 1)")


def test_truncated_gzip(tmp_path):
    full = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    path = write(tmp_path, "corpus.txt.gz", full[: len(full) // 2])
    message = error_of(path)
    assert message.startswith(f"{path} is a damaged or truncated gzip file")


# ------------------------------------------------------------------ jsonl errors


def test_malformed_json_line(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a"}\n{"text": "b",}\n')
    message = error_of(path)
    assert message.startswith(f"{path} line 2 is not valid JSON (")
    assert "column 14" in message and "one complete JSON object" in message


def test_two_objects_on_one_line(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a"} {"text": "b"}\n')
    assert "line 1 is not valid JSON (Extra data" in error_of(path)


@pytest.mark.parametrize(
    ("line", "kind"),
    [("[1, 2]", "a list"), ("42", "a number (42)"), ("null", "null"), ("true", "a boolean (true)")],
)
def test_json_line_that_is_not_object_or_string(tmp_path, line, kind):
    path = write(tmp_path, "corpus.jsonl", '"ok"\n' + line + "\n")
    assert error_of(path).startswith(f"{path} line 2 is {kind}, not a JSON object or string")


def test_missing_text_field_lists_the_fields_present(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a"}\n{"sentence": "b", "label": 1}\n')
    assert error_of(path) == (
        f"{path} line 2 has no field 'text' (its fields: 'sentence', 'label'); "
        "choose the text field with --text-field"
    )


@pytest.mark.parametrize(
    ("value", "kind"), [("null", "null"), ("3", "a number (3)"), ("1.5", "a number (1.5)"), ('["a"]', "a list")]
)
def test_text_field_that_is_not_a_string(tmp_path, value, kind):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a"}\n{"text": "b"}\n{"text": ' + value + "}\n")
    message = error_of(path)
    assert message.startswith(f"{path} line 3: field 'text' is {kind}, not a string")


def test_blank_jsonl_line(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a"}\n   \n{"text": "b"}\n')
    assert error_of(path).startswith(f"{path} line 2 is blank;")


def test_lone_surrogate_escape(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "bad \\ud800 here"}\n')
    message = error_of(path)
    assert "line 1: the text holds a lone surrogate escape (\\ud800)" in message


def test_jsonl_id_missing_on_a_line(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a", "id": "1"}\n{"text": "b", "idx": "2"}\n')
    message = error_of(path, id_field="id")
    assert message.startswith(f"{path} line 2 has no id field 'id' (its fields: 'text', 'idx')")


def test_jsonl_id_of_wrong_type_and_bare_string_with_id(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a", "id": null}\n')
    assert "line 1: id field 'id' is null; ids must be strings or integers" in error_of(path, id_field="id")
    path = write(tmp_path, "strings.jsonl", '"just text"\n')
    assert "line 1 is a bare JSON string, so it has no id field 'id'" in error_of(path, id_field="id")


def test_duplicate_ids_name_the_id_and_both_lines(tmp_path):
    path = write(
        tmp_path,
        "corpus.jsonl",
        '{"text": "a", "id": "x"}\n{"text": "b", "id": "y"}\n{"text": "c", "id": "x"}\n',
    )
    assert error_of(path, id_field="id") == (
        f"{path}: id 'x' appears on line 1 and again on line 3; ids in 'id' must be unique"
    )


def test_duplicate_ids_across_int_and_str(tmp_path):
    path = write(tmp_path, "corpus.jsonl", '{"text": "a", "id": 5}\n{"text": "b", "id": "5"}\n')
    assert "id '5' appears on line 1 and again on line 2" in error_of(path, id_field="id")


# -------------------------------------------------------------------- csv errors


def test_missing_csv_column_lists_the_columns(tmp_path):
    path = write(tmp_path, "corpus.csv", "sentence,label\nhi,1\n")
    assert error_of(path) == (
        f"{path} has no text column 'text' (columns: 'sentence', 'label'; the first line "
        "is read as the header); choose the text column with --column"
    )


def test_missing_csv_id_column(tmp_path):
    path = write(tmp_path, "corpus.csv", "text,label\nhi,1\n")
    message = error_of(path, id_field="uid")
    assert message.startswith(f"{path} has no id column 'uid' (columns: 'text', 'label'")


def test_semicolon_csv_gets_a_hint(tmp_path):
    path = write(tmp_path, "corpus.csv", "id;text\n1;hi\n")
    message = error_of(path)
    assert "(columns: 'id;text';" in message and "semicolon-separated" in message


def test_tsv_that_is_really_csv_gets_a_hint(tmp_path):
    path = write(tmp_path, "corpus.tsv", "id,text\n1,hi\n")
    assert "is this a CSV file?" in error_of(path)


def test_csv_row_with_wrong_number_of_fields(tmp_path):
    path = write(tmp_path, "corpus.csv", "id,text\n1,fine\n2,not, quoted\n")
    assert error_of(path) == (
        f"{path} line 3 has 3 fields but the header has 2 columns; "
        'wrap fields that hold commas in "..." (fields are split on commas)'
    )


def test_tsv_row_with_wrong_number_of_fields(tmp_path):
    path = write(tmp_path, "corpus.tsv", "id\ttext\n1\tfine\n2\n")
    assert error_of(path).startswith(f"{path} line 3 has 1 fields but the header has 2 columns;")


def test_csv_blank_line_in_multi_column_file(tmp_path):
    path = write(tmp_path, "corpus.csv", "id,text\n1,a\n\n2,b\n")
    assert error_of(path).startswith(f"{path} line 3 is blank but the header has 2 columns")


def test_csv_unclosed_quote(tmp_path):
    path = write(tmp_path, "corpus.csv", 'id,text\n1,a\n2,"runs away\n3,c\n')
    assert error_of(path).startswith(f"{path}: a quoted field starting on line 3 is never closed")


def test_csv_stray_quote(tmp_path):
    path = write(tmp_path, "corpus.csv", 'id,text\n1,"a"b\n')
    message = error_of(path)
    assert message.startswith(f"{path} line 2 is not valid CSV (")


def test_csv_duplicate_column(tmp_path):
    path = write(tmp_path, "corpus.csv", "text,text\na,b\n")
    assert "column 'text' appears 2 times in the header" in error_of(path)


def test_csv_blank_header(tmp_path):
    path = write(tmp_path, "corpus.csv", "\ntext\na\n")
    assert error_of(path).startswith(f"{path} line 1 is blank; the first line must be the header")


def test_csv_empty_and_duplicate_ids(tmp_path):
    path = write(tmp_path, "corpus.csv", "id,text\n,a\n")
    assert error_of(path, id_field="id").startswith(f"{path} line 2: the id column 'id' is empty")
    path = write(tmp_path, "dup.csv", "id,text\nk,a\nj,b\nk,c\n")
    assert error_of(path, id_field="id") == (
        f"{path}: id 'k' appears on line 2 and again on line 4; ids in 'id' must be unique"
    )


def test_csv_long_field_beyond_default_limit(tmp_path):
    long_text = "word " * 60_000  # 300,000 characters, over csv's default 131,072
    path = write(tmp_path, "corpus.csv", f'text\n"{long_text}"\n')
    records, _ = read_corpus(path)
    assert records[0].text == long_text


# ---------------------------------------------------------------- parquet errors


def test_missing_parquet_column_lists_the_columns(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"sentence": ["a"], "label": [1]}), path)
    assert error_of(path) == (
        f"{path} has no text column 'text' (columns: 'sentence', 'label'); "
        "choose the text column with --column"
    )
    assert "has no id column 'uid'" in error_of(path, column="sentence", id_field="uid")


def test_parquet_non_string_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), path)
    assert error_of(path) == (
        f"{path}: column 'text' holds int64, not strings; choose the column with the texts (--column)"
    )


def test_parquet_null_and_duplicate_ids(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "id": ["x", None, "z"]}), path)
    assert error_of(path, id_field="id").startswith(f"{path} row 2: the id column 'id' is null")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "id": [1, 2, 1]}), path)
    assert error_of(path, id_field="id") == (
        f"{path}: id '1' appears on line 1 and again on line 3; ids in 'id' must be unique"
    )


def test_corrupt_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    path = write(tmp_path, "c.parquet", b"this is not parquet at all")
    assert error_of(path).startswith(f"{path} is not a readable Parquet file (")


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    path = write(tmp_path, "c.parquet", b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingExtraError) as info:
        iter_corpus(path)
    assert str(info.value) == "this needs the optional package 'pyarrow': pip install 'layerscope[parquet]'"
