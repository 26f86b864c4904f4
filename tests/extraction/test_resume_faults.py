"""Extraction interrupted *inside* the engine and *inside* the store write, and corpora larger than the
extraction window: each must resume (or run) to exactly the store an uninterrupted run makes.

The interrupts are injected by wrapping the real objects (an engine that raises on its k-th batch, a
``LayerStore.write`` that raises half-way through its k-th call); the pipeline itself is not touched.
"""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.errors import Interrupted
from layerscope.engines.base import Engine, create_engine
from layerscope.export.exporter import export_model
from layerscope.model.source import resolve_source
from layerscope.model.handle import ModelHandle
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore

WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()
POOLINGS = ["mean", "max"]


def corpus(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 40)))) for _ in range(n)]


@pytest.fixture(scope="module")
def bert_export(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("bert-export-faults") / "onnx"
    export_model(resolve_source(str(tiny_model("bert"))), out, pooled=POOLINGS)
    return out


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text("\n".join(corpus(300, seed=5)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(bert_export, corpus_file, tmp_path_factory):
    """One uninterrupted run, window larger than the corpus."""
    out = tmp_path_factory.mktemp("reference") / "store"
    return extract(bert_export, str(corpus_file), out, engine="ort", layers="all", poolings=POOLINGS,
                   batch_tokens=128).store


class InterruptingEngine(Engine):
    """The real ORT engine, except that its ``interrupt_at``-th ``run`` raises KeyboardInterrupt
    before computing anything (a Ctrl-C landing inside ``engine.run``)."""

    def __init__(self, inner: Engine, interrupt_at: int):
        super().__init__(inner.model)
        self.inner = inner
        self.name = inner.name
        self.info = inner.info
        self.preferred_batch_tokens = inner.preferred_batch_tokens
        self.interrupt_at = interrupt_at
        self.calls = 0
        self.rows_done = 0  # rows of the batches that came back before the interrupt

    def encoder(self, max_length=None, prompt=""):
        return self.inner.encoder(max_length, prompt)

    def run(self, batch, layers, poolings):
        self.calls += 1
        if self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        out = self.inner.run(batch, layers, poolings)
        self.rows_done += batch.size
        return out

    def run_tokens(self, batch, layers):
        return self.inner.run_tokens(batch, layers)


def assert_same_store(got: LayerStore, want: LayerStore) -> None:
    assert got.complete and got.n == want.n
    assert got.texts() == want.texts() and got.ids() == want.ids()
    assert int(got.done_mask().sum()) == got.n
    for p in want.poolings:
        for layer in want.layers:
            arr = np.asarray(got[p, layer])
            # no row left as the zeros the store was created with
            assert (np.abs(arr).max(axis=1) > 0).all(), f"all-zero rows in {p}/{layer}"
            np.testing.assert_array_equal(arr, want[p, layer], err_msg=f"{p} layer {layer}")
            # and the files themselves, byte for byte
            name = f"arrays/{p}/{layer}.npy"
            assert (got.path / name).read_bytes() == (want.path / name).read_bytes(), name
    for name in ("texts.jsonl", "done.npy", "lengths.npy"):
        assert (got.path / name).read_bytes() == (want.path / name).read_bytes(), name


def _resume(bert_export, corpus_file, out, **kw):
    return extract(bert_export, str(corpus_file), out, engine="ort", layers="all", poolings=POOLINGS,
                   batch_tokens=128, resume=True, **kw)


def test_interrupt_inside_engine_run_resumes_to_an_identical_store(bert_export, corpus_file, reference, tmp_path):
    """Catches: moving ``pending.append(batch.index)`` above ``eng.run`` in extraction/pipeline.py (a batch is
    marked done before it is computed: the store resumes 'complete' with all-zero rows), and dropping the
    commit of pending rows in the pipeline's ``except`` branch (kept would not equal the rows computed)."""
    engine = InterruptingEngine(create_engine("ort", ModelHandle.resolve(bert_export)), interrupt_at=7)
    out = tmp_path / "store"
    with pytest.raises(Interrupted):  # extract turns Ctrl-C into Interrupted with the row count
        extract(bert_export, str(corpus_file), out, engine=engine, layers="all", poolings=POOLINGS,
                batch_tokens=128)
    partial = LayerStore.open(out, allow_incomplete=True)
    kept = int(partial.done_mask().sum())
    # exactly the rows of the six batches that came back (and were written) are kept, no more, no less
    assert kept == engine.rows_done and 0 < kept < partial.n
    report = _resume(bert_export, corpus_file, out)
    assert report.resumed_rows == kept
    assert_same_store(LayerStore.open(out), reference)


def test_interrupt_inside_store_write_resumes_to_an_identical_store(bert_export, corpus_file, reference,
                                                                    tmp_path, monkeypatch):
    """Catches: moving ``pending.append(batch.index)`` above ``store.write`` (or above ``eng.run``) in
    extraction/pipeline.py: a half-written batch would be marked done and never redone."""
    real_write = LayerStore.write
    calls = {"n": 0, "rows": 0}

    def write_then_interrupt(self, index, pooled, layers):
        calls["n"] += 1
        if calls["n"] == 5:
            # half the batch reaches the arrays (the first pooling), then Ctrl-C
            first = next(iter(pooled))
            real_write(self, index, {first: pooled[first]}, layers)
            raise KeyboardInterrupt
        real_write(self, index, pooled, layers)
        calls["rows"] += len(index)

    monkeypatch.setattr(LayerStore, "write", write_then_interrupt)
    out = tmp_path / "store"
    with pytest.raises(Interrupted):  # extract turns Ctrl-C into Interrupted with the row count
        extract(bert_export, str(corpus_file), out, engine="ort", layers="all", poolings=POOLINGS,
                batch_tokens=128)
    monkeypatch.setattr(LayerStore, "write", real_write)
    kept = int(LayerStore.open(out, allow_incomplete=True).done_mask().sum())
    assert kept == calls["rows"] and 0 < kept < 300
    report = _resume(bert_export, corpus_file, out)
    assert report.resumed_rows == kept
    assert_same_store(LayerStore.open(out), reference)


def test_corpus_larger_than_the_window(bert_export, corpus_file, reference, tmp_path):
    """A window of 64 rows over 300 texts (four full windows and a partial one) gives the store a window
    larger than the corpus gives, and every row equals its text embedded alone.

    Catches: dropping the window offset in extraction/pipeline.py's prefetcher (``index=rows + row`` ->
    ``index=rows``, or reading ``lengths``/``done`` without ``[row:stop]``)."""
    windowed = extract(bert_export, str(corpus_file), tmp_path / "w", engine="ort", layers="all",
                       poolings=POOLINGS, batch_tokens=128, window=64).store
    assert windowed.complete and windowed.texts() == reference.texts()
    for p in POOLINGS:
        for layer in reference.layers:
            # batches differ between the two plans (other padding), so equal to float rounding, not bitwise
            np.testing.assert_allclose(windowed[p, layer], reference[p, layer], rtol=0, atol=2e-5,
                                       err_msg=f"{p} layer {layer}")
    engine = create_engine("ort", ModelHandle.resolve(bert_export))
    encoder = engine.encoder()
    texts = reference.texts()
    alone = np.stack([engine.run(encoder([t]), ["2"], ["mean"])["mean"][0, 0] for t in texts])
    np.testing.assert_allclose(windowed["mean", "2"], alone, rtol=0, atol=2e-5)


def test_interrupted_windowed_run_resumes_to_an_identical_store(bert_export, corpus_file, tmp_path):
    """Interrupted in the third window, resumed with the same window: the rows marked done in every
    window are skipped and only those. Catches: ``done[row:stop]`` read without its offset."""
    full = extract(bert_export, str(corpus_file), tmp_path / "full", engine="ort", layers="all",
                   poolings=POOLINGS, batch_tokens=128, window=64).store
    engine = InterruptingEngine(create_engine("ort", ModelHandle.resolve(bert_export)), interrupt_at=70)
    out = tmp_path / "part"
    with pytest.raises(Interrupted):  # extract turns Ctrl-C into Interrupted with the row count
        extract(bert_export, str(corpus_file), out, engine=engine, layers="all", poolings=POOLINGS,
                batch_tokens=128, window=64)
    kept = int(LayerStore.open(out, allow_incomplete=True).done_mask().sum())
    assert kept == engine.rows_done and 64 < kept < 300 - 64  # past the first window, short of the last
    report = _resume(bert_export, corpus_file, out, window=64)
    assert report.resumed_rows == kept
    assert_same_store(LayerStore.open(out), full)
