"""STS pair readers: the original STS Benchmark layout, named-column files, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from layerscope.data.pairs import read_pairs
from layerscope.errors import InputError

STS_DIR = Path(os.environ.get("LAYERSCOPE_STS_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"
                              / "stsbenchmark"))


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def test_original_sts_format_crlf_quotes_and_9_columns(tmp_path):
    p = _write(tmp_path / "sts-x.csv",
               'main-news\theadlines\t2015\t0001\t4.0\tHe said "yes" today.\tHe agreed "today".\r\n'
               "main-news\theadlines\t2015\t0002\t1.5\tA cat\tA dog\tsrc1\tsrc2\r\n"
               'main-forums\tanswers\t2016\t0003\t0.000\t"Quoted start\tends here"\r\n')
    pairs = read_pairs(p)
    assert pairs.fmt == "sts"
    assert pairs.s1 == ['He said "yes" today.', "A cat", '"Quoted start']
    assert pairs.s2 == ['He agreed "today".', "A dog", 'ends here"']
    np.testing.assert_array_equal(pairs.scores, [4.0, 1.5, 0.0])
    assert pairs.genres[1] == "main-news"
    texts, i1, i2 = pairs.unique_texts()
    assert [texts[i] for i in i1] == pairs.s1 and [texts[i] for i in i2] == pairs.s2


def test_csv_tsv_jsonl_with_named_columns(tmp_path):
    csv_p = _write(tmp_path / "p.csv", 'sentence1,sentence2,score\n"a, b",c,1\nd,"e ""x""",2\nf,g,3\n')
    pairs = read_pairs(csv_p)
    assert pairs.fmt == "csv" and pairs.s1[0] == "a, b" and pairs.s2[1] == 'e "x"'
    tsv_p = _write(tmp_path / "p.tsv", 'left\tright\tgold\n"a\tb\t1\nc\td"\t2.5\ne\tf\t3\n')
    pairs = read_pairs(tsv_p, sentence1="left", sentence2="right", score="gold")
    assert pairs.s1 == ['"a', "c", "e"] and pairs.s2[1] == 'd"'
    np.testing.assert_array_equal(pairs.scores, [1, 2.5, 3])
    jl = tmp_path / "p.jsonl"
    jl.write_text("\n".join(json.dumps({"s1": f"x{i}", "s2": f"y{i}", "label": i}) for i in range(4)) + "\n")
    pairs = read_pairs(jl)
    assert pairs.fmt == "jsonl" and len(pairs) == 4 and pairs.scores[3] == 3


@pytest.mark.parametrize("row, message", [
    ("g\tf\t2015\t1\t\tA\tB", "score is missing"),
    ("g\tf\t2015\t1\tabc\tA\tB", "'abc' is not a number"),
    ("g\tf\t2015\t1\tnan\tA\tB", "must be finite"),
    ("g\tf\t2015\t1\t2.0\t \tB", "sentence1 (column 6) is empty"),
    ("g\tf\t2015\t1\t2.0\tA", "6 tab-separated columns"),
])
def test_bad_sts_rows_name_the_line(tmp_path, row, message):
    good = "g\tf\t2015\t0\t1.0\tA b\tC d\r\n"
    p = _write(tmp_path / "bad.csv", good + good + row + "\r\n" + good)
    with pytest.raises(InputError) as err:
        read_pairs(p)
    assert f"bad.csv:3" in str(err.value) and message in str(err.value)


def test_bad_named_rows_and_too_few_pairs(tmp_path):
    p = _write(tmp_path / "p.csv", "sentence1,sentence2,score\na,b,1\nc,,2\ne,f,3\n")
    with pytest.raises(InputError, match=r"p.csv:3: sentence2 is empty"):
        read_pairs(p)
    p = _write(tmp_path / "q.jsonl", '{"sentence1": "a", "sentence2": "b", "score": null}\n')
    with pytest.raises(InputError, match=r"q.jsonl:1: the score is missing"):
        read_pairs(p)
    p = _write(tmp_path / "r.csv", "sentence1,sentence2,score\na,b,1\nc,d,2\n")
    with pytest.raises(InputError, match="holds 2 pair"):
        read_pairs(p)
    p = _write(tmp_path / "s.csv", "x,y,z\na,b,1\n")
    with pytest.raises(InputError, match="--sentence1"):
        read_pairs(p)
    with pytest.raises(InputError, match="does not exist"):
        read_pairs(tmp_path / "missing.csv")


def test_hub_id_needs_datasets_or_hub(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *args, **kwargs):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(InputError, match="needs the 'datasets' package"):
        read_pairs("hf:mteb/stsbenchmark-sts")


@pytest.mark.skipif(not (STS_DIR / "sts-test.csv").exists(), reason="STS Benchmark not available")
def test_real_sts_benchmark_files():
    counts = {"train": 5749, "dev": 1500, "test": 1379}
    for split, n in counts.items():
        pairs = read_pairs(STS_DIR / f"sts-{split}.csv")
        assert pairs.fmt == "sts" and len(pairs) == n
        assert 0.0 <= pairs.scores.min() and pairs.scores.max() <= 5.0
        assert not any(s.endswith("\r") for s in pairs.s2)
