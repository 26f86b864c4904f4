"""Range writers (``--shard``, Ray) where one range is more than one granule, and the order and staleness rules
that keep a store right when a worker dies: each test names the rule it guards.

Everything runs in this process with the test-only ``fake`` engine (the multi-process runs are in
test_shard_extract.py); the expected values are worked out by hand or come from the plain in-process
``extract``, which writes batches through another path.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from layerscope.store import store_ranges
from layerscope.store.range_marks import DoneMark
from layerscope.store.store import LayerStore
from layerscope.store.store_record import RangePlan

WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
N = 1100  # ranges of 512 rows: [0, 512), [512, 1024), [1024, 1100)
pytestmark = pytest.mark.usefixtures("fake")  # the test-only engine (tests/extraction/conftest.py)
KW = dict(engine="fake", layers="all", poolings=["mean", "cls"], text_field="body", id_field="doc", prompt="query: ")


@pytest.fixture(scope="module")
def corpus(fake, tiny_model, tmp_path_factory):
    """The tiny BERT and a corpus whose rows differ in length (so a row read from the wrong offset shows)."""
    root = tmp_path_factory.mktemp("range-guards")
    rng = np.random.default_rng(1)
    path = root / "c.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(N):
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 40))))
            fh.write(json.dumps({"doc": f"d{i:05d}", "body": text}) + "\n")
    return str(tiny_model("bert")), path


def test_plan_offsets_come_from_each_ranges_first_row():
    """A range of 512 rows starts at row 512, whose byte offset is the third recorded one (every 256th row),
    not the one numbered like the range."""
    offsets = np.array([0, 2560, 5120, 7680, 10240], dtype=np.int64)  # rows 0, 256, 512, 768, 1024
    got = [(r.k, r.start, r.stop, r.offset) for r in store_ranges.plan(N, 512, offsets)]
    assert got == [(0, 0, 512, 0), (1, 512, 1024, 5120), (2, 1024, 1100, 10240)]


@pytest.fixture(scope="module")
def half_stores(corpus, tmp_path_factory):
    """A float16 store from two shards with ranges of two granules, and the plain run's float16 store."""
    from layerscope.extraction.pipeline import extract
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard

    model, path = corpus
    root = tmp_path_factory.mktemp("half")
    plain = extract(model, str(path), root / "plain", store_dtype="float16", **KW).store
    req = ExtractionRequest.of(model, str(path), root / "sharded", store_dtype="float16", **KW)
    reports = [extract_shard(req, i, 2, range_rows=512) for i in range(2)]
    assert reports[-1].ranges.finished and reports[-1].complete
    return plain, LayerStore.open(root / "sharded")


def test_shards_with_ranges_of_two_granules_read_their_own_texts(half_stores):
    """Every row of a range after the first holds the vectors of its own text (the range reads texts.jsonl
    from its first row's offset): equal to the plain run bit for bit."""
    plain, sharded = half_stores
    assert sharded.record.ranges == RangePlan(rows=512, count=3)
    assert sharded.ids() == plain.ids() and sharded.texts() == plain.texts()
    for p in plain.poolings:
        for layer in plain.layers:
            np.testing.assert_array_equal(sharded.raw((p, layer)), plain.raw((p, layer)), err_msg=f"{p}/{layer}")
    assert LayerStore.verify(sharded.path)[1] == []


def test_a_half_size_sharded_store_writes_lengths_at_their_own_rows(half_stores, corpus):
    """lengths.npy is int32 whatever the vectors' type: a float16 store's ranges after the first write
    their token counts at row * 4 bytes. Checked against the plain run and against the tokenizer itself."""
    from transformers import AutoTokenizer

    plain, sharded = half_stores
    lengths = np.load(sharded.path / "lengths.npy")
    np.testing.assert_array_equal(lengths, np.load(plain.path / "lengths.npy"))
    model, _ = corpus
    tok = AutoTokenizer.from_pretrained(model)
    texts = sharded.texts()
    for i in (0, 511, 512, 777, 1023, 1024, N - 1):  # first range, both sides of each boundary, last row
        assert lengths[i] == len(tok("query: " + texts[i])["input_ids"]), i


def test_the_done_mark_is_fsynced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    """A done mark says the range is durable; it must itself be on disk before it appears under its name,
    and the directory entry synced after the rename."""
    events: list[tuple[str, int]] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(store_ranges.os, "fsync", lambda fd: (events.append(("fsync", os.fstat(fd).st_ino)),
                                                             real_fsync(fd))[1])
    monkeypatch.setattr(store_ranges.os, "replace", lambda a, b: (events.append(("replace", os.stat(a).st_ino)),
                                                                 real_replace(a, b))[1])
    store_ranges.mark_done(tmp_path, 3, DoneMark(3, tokens=7))
    final = store_ranges.done_path(tmp_path, 3)
    assert json.loads(final.read_text())["tokens"] == 7
    assert store_ranges.done_mark(tmp_path, 3) == DoneMark(3, tokens=7)
    mark = os.stat(final).st_ino
    assert events.index(("fsync", mark)) < events.index(("replace", mark))
    assert ("fsync", os.stat(final.parent).st_ino) in events[events.index(("replace", mark)):]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_finish_refuses_while_the_last_missing_range_is_a_dead_workers(corpus, tmp_path):
    """A worker killed inside the last range leaves only its stale claim: neither ``--shard finish`` nor the
    shard that finishes the others may mark the store complete over those unwritten (all-zero) rows."""
    from layerscope.errors import StoreError
    from layerscope.extraction import range_run
    from layerscope.extraction.range_writer import RangeWriter
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import shard_finish, shard_status

    model, path = corpus
    out = tmp_path / "s"
    req = ExtractionRequest.of(model, str(path), out, resume=True, **KW)
    ex, store = range_run.open_or_create(req, range_rows=256)
    writer = RangeWriter(store.path, range_run.open_engine_for(ex, req), layers=ex.layers,
                         poolings=ex.poolings, store_dtype="float32", max_length=ex.max_length,
                         prompt=ex.spec.prompt, batch_tokens=None, max_batch=64)
    ranges = range_run.ranges_of(store)
    assert len(ranges) == 5
    for r in ranges[:-1]:
        writer.run(r)
    claim = store_ranges.try_claim(store.path, ranges[-1].k)  # the victim's claim, then the victim dies
    info = json.loads(claim.path.read_text())
    claim.path.write_text(json.dumps({**info, "pid": _dead_pid()}))
    status, count, complete = shard_status(out)
    assert (status.done, status.stale, status.missing, count, complete) == ([0, 1, 2, 3], [4], [], 5, False)
    assert not status.complete
    with pytest.raises(StoreError, match="1 of 5 ranges are not done .*1 left by a worker that died"):
        shard_finish(out)
    assert not LayerStore.open(out, allow_incomplete=True).complete


def test_another_hosts_claim_is_stale_only_a_lease_after_its_last_touch(tmp_path):
    """A worker on another host renews its lease by touching its claim: a claim made long ago but touched
    just now is live; one not touched for longer than the lease is stale, however recently it began."""
    store_ranges.claim_path(tmp_path, 0).parent.mkdir()
    now = time.time()
    old_but_touched = store_ranges.claim_path(tmp_path, 0)
    old_but_touched.write_text(json.dumps({"host": "elsewhere-" + socket.gethostname(), "pid": 1, "token": "a",
                                           "since": now - 3 * store_ranges.LEASE_S}))
    os.utime(old_but_touched, (now, now))
    assert not store_ranges.claim_is_stale(old_but_touched, now=now)
    new_but_silent = store_ranges.claim_path(tmp_path, 1)
    new_but_silent.write_text(json.dumps({"host": "elsewhere-" + socket.gethostname(), "pid": 1, "token": "b",
                                          "since": now}))
    silent = now - store_ranges.LEASE_S - 5
    os.utime(new_but_silent, (silent, silent))
    assert store_ranges.claim_is_stale(new_but_silent, now=now)
