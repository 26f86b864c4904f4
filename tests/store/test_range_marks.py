"""A range's done mark and claim as typed records: written and read back field for field, an older mark's missing
fields read as not recorded, an ill-typed field of a done mark one line naming the file and the field, and a claim
no worker could have written named as damaged."""

from __future__ import annotations

import json

import pytest

from layerscope.errors import StoreError
from layerscope.store import store_ranges
from layerscope.store.range_marks import ClaimRecord, DoneMark


def _mark() -> DoneMark:
    return DoneMark(k=2, start=512, stop=768, tokens=3170, host="node-7", pid=4242, seconds=1.25, write_s=0.5,
                    batch_tokens=8192, engine={"engine": "ort", "provider": "CPUExecutionProvider"},
                    half_error={"mean/3": (0.002, 0.9999)}, variant="fp16", store="ab" * 16)


def test_a_done_mark_reads_back_as_written(tmp_path):
    """Catches: a field written under one name and read under another (the half-size error or the variant lost,
    which finish merges), a mark read as another range's."""
    store_ranges.mark_done(tmp_path, 2, _mark())
    assert store_ranges.done_mark(tmp_path, 2) == _mark()
    assert store_ranges.is_done(tmp_path, 2, "ab" * 16) and not store_ranges.is_done(tmp_path, 2, "cd" * 16)


def test_an_older_mark_records_no_variant_and_a_plain_run_records_none():
    """Catches: a mark written before marks named the variant counted as a run without one (finish would refuse
    a store whose other ranges ran a variant), or a plain run's null variant not counted."""
    older = DoneMark.read({"k": 1, "tokens": 5}, "r/1.done", 1)
    assert older == DoneMark(1, tokens=5, variant_known=False)
    plain = DoneMark.read({"k": 1, "variant": None}, "r/1.done", 1)
    assert plain.variant is None and plain.variant_known
    assert DoneMark.read(None, "r/1.done", 1) == DoneMark(1, variant_known=False)  # unparsable: records nothing


@pytest.mark.parametrize("edit,message", [
    ({"tokens": "3170"}, "tokens is str, not int"),
    ({"batch_tokens": True}, "batch_tokens is bool, not int"),
    ({"engine": "ort"}, "engine is str, not dict"),
    ({"half_error": {"mean/3": [0.1]}}, "half_error.mean/3 is not \\[max abs error, min cosine\\]"),
    ({"variant": 16}, "variant is int, not str"),
])
def test_an_ill_typed_done_mark_is_one_line_naming_the_file_and_field(tmp_path, edit, message):
    """Catches: an edited done mark failing finish with a bare TypeError (or merged as if it were right)."""
    store_ranges.mark_done(tmp_path, 2, _mark())
    path = store_ranges.done_path(tmp_path, 2)
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}), encoding="utf-8")
    with pytest.raises(StoreError, match=message) as err:
        store_ranges.done_mark(tmp_path, 2)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_a_claim_reads_back_and_a_damaged_one_says_why():
    """Catches: a claim's token or store lost between writing and reading (a worker would not know its own
    claim), a claim no worker wrote read as a live one."""
    claim = ClaimRecord("node-7", 4242, 123456, "boot-1", "tok", 1700000000.5, "ab" * 16)
    assert ClaimRecord.read(json.loads(json.dumps(claim.to_json()))) == claim
    for doc, why in (([1], "JSON list, not a claim"), ({"host": "h", "pid": 0}, "is not a process id"),
                     ({"host": "h", "pid": True}, "is not a process id"), ({"pid": 5}, "names no host"),
                     ({"host": "h", "pid": 5, "started": "x"}, "start time 'x' is not a number"),
                     ({"host": "h", "pid": 5, "store": 7}, "store identity is not text")):
        assert why in ClaimRecord.problem(doc) and ClaimRecord.read(doc) is None
