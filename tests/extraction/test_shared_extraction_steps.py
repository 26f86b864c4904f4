"""The steps extract and the Ray driver share: the background tokenizer, and the checks made before a row is read.

The Ray driver is called with its cluster connection stubbed out: every case here is decided before
any Ray work starts, so no cluster is needed.
"""

from __future__ import annotations

import threading

import pytest

from layerscope.errors import InputError, StoreError
from layerscope.extraction.batching import Background
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore

TEXTS = ["the cat sat", "a dog ran far", "", "birds fly over the river", "one more"]


# ---------------------------------------------------------------- the background tokenizer

def test_background_keeps_order_and_runs_on_its_own_thread():
    threads = []

    def items():
        for i in range(50):
            threads.append(threading.current_thread())
            yield i

    with Background(items(), depth=2) as feed:
        assert list(feed) == list(range(50))
    assert {t.name for t in threads} == {"layerscope-tokenize"}


def test_background_raises_the_producers_error_on_the_consuming_thread():
    def items():
        yield 1
        raise InputError("bad row 2")

    got = []
    with pytest.raises(InputError, match="bad row 2"), Background(items()) as feed:
        got.extend(feed)
    assert got == [1]


def test_closing_stops_the_producer_and_runs_its_cleanup():
    made, cleaned = [], []

    def items():
        try:
            for i in range(10_000):
                made.append(i)
                yield i
        finally:
            cleaned.append(threading.current_thread().name)  # e.g. the open texts.jsonl is closed

    feed = Background(items(), depth=2)
    first = next(iter(feed))
    feed.close()
    assert first == 0 and len(made) < 10  # stopped a few items ahead, not at the end
    assert cleaned == ["layerscope-tokenize"]


# ---------------------------------------------------------------- the Ray driver's checks are extract's

@pytest.fixture
def no_cluster(monkeypatch):
    pytest.importorskip("ray")
    import layerscope.extraction.ray_extract as ray_extract

    monkeypatch.setattr(ray_extract, "connect", lambda address, **kw: False)
    return ray_extract.extract_ray


def test_ray_resume_refuses_other_in_memory_texts(bert_export, tmp_path, no_cluster):
    extract(bert_export, TEXTS, tmp_path / "store", engine="ort", layers="-1")
    changed = TEXTS[:-1] + ["another text"]
    with pytest.raises(StoreError, match="another version"):  # once resumed as if nothing had changed
        no_cluster(bert_export, changed, tmp_path / "store", engine="ort", layers="-1", resume=True)
    assert LayerStore.open(tmp_path / "store").texts() == TEXTS


def test_ray_refuses_what_extract_refuses_before_writing(bert_export, tmp_path, no_cluster):
    with pytest.raises(InputError) as plain:
        extract(bert_export, TEXTS, tmp_path / "a", engine="ort", poolings=["st"])
    with pytest.raises(InputError) as ray:
        no_cluster(bert_export, TEXTS, tmp_path / "b", engine="ort", poolings=["st"])
    assert str(ray.value) == str(plain.value) and "sentence-transformers" in str(plain.value)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_ray_force_with_a_bad_option_keeps_the_old_store(bert_export, tmp_path, no_cluster):
    extract(bert_export, TEXTS, tmp_path / "store", engine="ort", layers="-1")
    with pytest.raises(InputError, match="layer"):  # once checked after the old store was deleted
        no_cluster(bert_export, TEXTS, tmp_path / "store", engine="ort", layers="99", force=True)
    assert LayerStore.open(tmp_path / "store").complete
