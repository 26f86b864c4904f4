"""The zh-en problem generator and the pair readers."""

from __future__ import annotations

import json
import re

import pytest

from layerscope.data.bilingual import CATEGORIES, generate_pairs
from layerscope.data.aligned import read_line_pairs, read_pairs
from layerscope.errors import InputError


def test_same_seed_same_pairs_and_different_seed_different():
    a = generate_pairs(50, seed=3)
    b = generate_pairs(50, seed=3)
    c = generate_pairs(50, seed=4)
    assert [p.to_dict() for p in a] == [p.to_dict() for p in b]
    assert [p.source for p in a] != [p.source for p in c]
    assert len({p.target for p in c}) == 50  # no repeated problems at small n


def test_categories_interleaved_and_answers_computed():
    pairs = generate_pairs(100, seed=0)
    assert [p.category for p in pairs[:5]] == list(CATEGORIES)
    assert {c: sum(p.category == c for p in pairs) for c in CATEGORIES} == {c: 20 for c in CATEGORIES}
    checked = 0
    for p in pairs:
        assert re.search(r"[\u4e00-\u9fff]", p.source) and not re.search(r"[\u4e00-\u9fff]", p.target)
        m = re.match(r"What is the remainder when (\d+) is divided by (\d+)\?", p.target)
        if m:
            assert p.answer == int(m.group(1)) % int(m.group(2))
            assert f"{m.group(1)}除以{m.group(2)}" in p.source
            checked += 1
        m = re.match(r"A rectangle is (\d+) (\w+) long and (\d+) \w+ wide", p.target)
        if m:
            assert p.answer == int(m.group(1)) * int(m.group(3))
            checked += 1
        # every number of the English text appears in the Chinese one
        assert sorted(re.findall(r"\d+", p.target)) == sorted(re.findall(r"\d+", p.source))
    assert checked >= 10


def test_generator_rejects_bad_n():
    with pytest.raises(InputError, match="--n"):
        generate_pairs(0)


def test_read_pairs_tsv_csv_jsonl(tmp_path):
    tsv = tmp_path / "p.tsv"
    tsv.write_text('source\ttarget\tcategory\n你好\thello "there"\tgreet\n再见\tgoodbye\tgreet\n你好\thello "there"\tgreet\n',
                   encoding="utf-8")
    ps = read_pairs(tsv)
    assert ps.targets == ['hello "there"', "goodbye", 'hello "there"']
    assert ps.categories == ["greet"] * 3
    assert ps.duplicates == 1 and "repeat an earlier pair" in ps.notes[0]
    csv_path = tmp_path / "p.csv"
    csv_path.write_text('zh,en\n"一, 二","one, two"\n三,three\n', encoding="utf-8")
    ps = read_pairs(csv_path, source="zh", target="en")
    assert ps.sources == ["一, 二", "三"] and ps.categories is None and ps.duplicates == 0
    jl = tmp_path / "p.jsonl"
    jl.write_text("\n".join(json.dumps({"source": s, "target": t, "id": f"x{i}"})
                            for i, (s, t) in enumerate([("a", "b"), ("c", "d")])) + "\n")
    assert read_pairs(jl).ids == ["x0", "x1"]


def test_read_pairs_bad_input(tmp_path):
    bad = tmp_path / "p.tsv"
    bad.write_text("source\ttarget\nonly\tone\n")
    with pytest.raises(InputError, match="1 pair.*at least 2"):
        read_pairs(bad)
    bad.write_text("source\ttarget\na\tb\nc\t\n")
    with pytest.raises(InputError, match="line 3 has an empty target"):
        read_pairs(bad)
    bad.write_text("src\ttarget\na\tb\n")
    with pytest.raises(InputError, match="no column 'source'.*--source-column"):
        read_pairs(bad)


def test_line_pairs_lengths_must_match(tmp_path):
    s, t = tmp_path / "s.txt", tmp_path / "t.txt"
    s.write_text("a\nb\nc\n")
    t.write_text("x\ny\n")
    with pytest.raises(InputError, match="has 3 lines but --target-file .* has 2"):
        read_line_pairs(s, t)
    t.write_text("x\n\nz\n")
    with pytest.raises(InputError, match="line 2 has an empty target"):
        read_line_pairs(s, t)
    t.write_text("x\ny\nz\n")
    assert read_line_pairs(s, t).targets == ["x", "y", "z"]
