"""``read_text_pairs`` on plain ``text A<TAB>text B`` lines: the pairs as written, and one line per bad row."""

from __future__ import annotations

import pytest

from layerscope.data.text_pairs import read_text_pairs
from layerscope.errors import InputError


def test_tab_lines_are_pairs_in_file_order(tmp_path):
    p = tmp_path / "pairs.tsv"
    p.write_bytes("\ufeffA cat sits.\tA \"cat\" sat.\r\n\r\n  \nDogs run\tdogs ran\n".encode("utf-8"))
    assert read_text_pairs(p) == [("A cat sits.", 'A "cat" sat.'), ("Dogs run", "dogs ran")]


@pytest.mark.parametrize("body, message", [
    ("a\tb\nonly one text\n", "pairs.tsv:2: 1 tab-separated fields"),
    ("a\tb\n\nx\ty\tz\n", "pairs.tsv:3: 3 tab-separated fields"),
    ("a\t  \n", "pairs.tsv:1: the second text is empty"),
])
def test_a_bad_line_is_one_error_naming_file_and_line(tmp_path, body, message):
    p = tmp_path / "pairs.tsv"
    p.write_text(body, encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_text_pairs(p)
    assert message in str(err.value)
