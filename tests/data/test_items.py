"""Compositionality items: the shipped set and bad input."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from layerscope.data.items import read_items
from layerscope.errors import InputError


def _words(s: str) -> Counter:
    return Counter(re.findall(r"[a-z']+", s.lower()))


def test_shipped_items_are_well_formed():
    items = read_items()
    assert len(items) >= 40
    cats = Counter((it.category, it.complexity) for it in items)
    for cat in ("agent-patient", "modifier", "preposition"):
        for cx in ("simple", "complex"):
            assert cats[cat, cx] >= 5, (cat, cx)
    for it in items:
        assert 2 <= len(it.paraphrases) <= 5
        # the negative uses exactly the positive's words, in another order
        assert _words(it.negative) == _words(it.positive), it.id
        assert it.negative != it.positive and it.positive not in it.paraphrases


def test_bad_items_name_the_line(tmp_path):
    good = {"id": "a", "positive": "x y", "negative": "y x", "paraphrases": ["x then y"]}
    cases = [
        ({**good, "id": "b", "paraphrases": []}, "has no paraphrases"),
        ({k: v for k, v in good.items() if k != "paraphrases"} | {"id": "b"}, "has no paraphrases"),
        ({**good, "id": "b", "negative": ""}, "'negative' is empty"),
        ({**good, "id": "b", "paraphrases": ["ok", ""]}, "paraphrase 2 is empty"),
        ({**good}, "id 'a' already used on line 1"),
    ]
    for obj, msg in cases:
        p = tmp_path / "items.jsonl"
        p.write_text(json.dumps(good) + "\n" + json.dumps(obj) + "\n")
        with pytest.raises(InputError) as err:
            read_items(p)
        assert "items.jsonl:2" in str(err.value) and msg in str(err.value)
    p = tmp_path / "broken.jsonl"
    p.write_text("{not json\n")
    with pytest.raises(InputError, match="broken.jsonl:1: not valid JSON"):
        read_items(p)
