"""The bench's --sts reader is data.pairs' STS reader: the same checks as every analysis's pairs file."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.data.pairs import read_pairs, read_sts
from layerscope.errors import InputError

GOOD = "main-captions\tMSRvid\t2012test\t0001\t{score}\t{a}\t{b}\r\n"


def _sts(path, rows):
    path.write_text("".join(GOOD.format(score=s, a=a, b=b) for s, a, b in rows), encoding="utf-8", newline="")
    return path


def test_read_sts_matches_the_pairs_reader(tmp_path):
    p = _sts(tmp_path / "sts.csv", [("5.000", "A plane takes off.", "An air plane is taking off."),
                                     ("3.800", 'He said "hi".', "A man spoke."),
                                     ("0.500", "A cat.", "A dog runs.")])
    s1, s2, gold = read_sts(p)
    pairs = read_pairs(p)
    assert s1 == pairs.s1 == ["A plane takes off.", 'He said "hi".', "A cat."]
    assert s2 == pairs.s2
    assert gold.dtype == np.float64 and gold.tolist() == [5.0, 3.8, 0.5]


@pytest.mark.parametrize("score, a, message", [
    ("nan", "A cat.", "must be finite"),  # once read as NaN, giving a NaN Spearman in the bench
    ("2.0", " ", "sentence1 (column 6) is empty"),  # once read as an empty text
])
def test_read_sts_refuses_rows_the_bench_once_took(tmp_path, score, a, message):
    p = _sts(tmp_path / "sts.csv", [("1.0", "x y", "z w"), (score, a, "B b."), ("2.0", "c d", "e f")])
    with pytest.raises(InputError) as err:
        read_sts(p)
    assert "sts.csv:2" in str(err.value) and message in str(err.value)


def test_read_sts_is_only_the_original_layout(tmp_path):
    p = tmp_path / "pairs.csv"
    p.write_text("sentence1,sentence2,score\na,b,1\nc,d,2\ne,f,3\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"pairs.csv:1: 1 tab-separated columns"):
        read_sts(p)
    with pytest.raises(InputError, match="no such file"):
        read_sts(tmp_path / "missing.csv")
