"""A .jsonl corpus's ``id`` field names its rows (taken when present, said on the console) in the store and in
every export: the pooled Parquet and safetensors files and the token Parquet file's text id column."""

from __future__ import annotations

import json

import pytest

from cli_helpers import run_cli
from layerscope.data.corpus import CorpusStats, read_corpus
from layerscope.errors import InputError

IDS = ["doc-b", "doc-a", "7", "x y"]
TEXTS = ["A man plays the guitar.", "A cat sat on the mat.", "The train leaves at noon.", "Rain in the hills."]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_id_field_is_taken_when_present(tmp_path):
    src = _jsonl(tmp_path / "c.jsonl", [{"id": i, "text": t} for i, t in zip(IDS, TEXTS)])
    records, stats = read_corpus(src)
    assert [r.id for r in records] == IDS and [r.text for r in records] == TEXTS
    assert stats.id_field == "id" and stats.ids_line() == "ids: from the field 'id'"
    numbered = _jsonl(tmp_path / "n.jsonl", [{"text": t} for t in TEXTS])
    records, stats = read_corpus(numbered)
    assert [r.id for r in records] == ["0", "1", "2", "3"] and stats.id_field is None
    assert stats.ids_line().startswith("ids: row numbers")
    named = _jsonl(tmp_path / "k.jsonl", [{"id": i, "key": f"k{n}", "text": t}
                                          for n, (i, t) in enumerate(zip(IDS, TEXTS))])
    records, stats = read_corpus(named, id_field="key")  # a named field wins over "id"
    assert [r.id for r in records] == ["k0", "k1", "k2", "k3"] and stats.id_field == "key"


def test_an_id_on_the_first_line_only_or_twice_is_one_clear_line(tmp_path):
    src = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "one"}, {"text": "two"}])
    with pytest.raises(InputError, match=r"line 2 has no id field 'id'.*the first line has one"):
        read_corpus(src)
    dup = _jsonl(tmp_path / "d.jsonl", [{"id": "a", "text": "one"}, {"id": "a", "text": "two"}])
    with pytest.raises(InputError, match=r"id 'a' appears on line 1 and again on line 2; ids in 'id' must be unique"):
        read_corpus(dup)


def test_ids_reach_the_store_and_every_export(tiny_model, tmp_path, capsys):
    import pyarrow.parquet as pq
    from safetensors import safe_open

    from layerscope.store.store import LayerStore

    src = _jsonl(tmp_path / "c.jsonl", [{"id": i, "text": t} for i, t in zip(IDS, TEXTS)])
    out = tmp_path / "store"
    code, text = run_cli(["extract", "-m", tiny_model("bert"), "-e", "torch", "-i", src, "-o", out,
                          "--layers", "0,-1", "--tokens"], capsys)
    assert code == 0, text
    assert "ids: from the field 'id'" in text
    store = LayerStore.open(out)
    assert store.ids() == IDS and store.record.id_field == "id"

    code, text = run_cli(["export-store", out, "--format", "parquet"], capsys)
    assert code == 0, text
    pooled = pq.read_table(str(tmp_path / "store.parquet")).to_pydict()
    assert pooled["id"] == IDS

    code, text = run_cli(["export-store", out, "--format", "safetensors"], capsys)
    assert code == 0, text
    with safe_open(str(tmp_path / "store.safetensors"), framework="numpy") as fh:
        assert json.loads(fh.metadata()["ids"]) == IDS

    code, text = run_cli(["export-store", out, "--tokens", "--format", "parquet"], capsys)
    assert code == 0, text
    tokens = pq.read_table(str(tmp_path / "store.tokens.parquet")).to_pydict()
    first = store.tokens(store.token_layers[0])
    for row in range(len(IDS)):  # every token of text `row` carries that text's id
        a, b = first.text_range(row)
        assert set(tokens["text_id"][a:b]) == {IDS[row]} and set(tokens["text"][a:b]) == {row}
    assert CorpusStats().ids_line().startswith("ids: row numbers")
