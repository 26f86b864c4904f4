"""Extraction into a LayerStore: order, batching, resume after a crash, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.errors import InputError, Interrupted, StoreError
from layerscope.model.handle import ModelHandle
from layerscope.extraction.batching import plan_batches
from layerscope.extraction.pipeline import embed, extract
from layerscope.store.store import LayerStore

WORDS = "the cat dog man woman bites sees a quick brown fox over lazy river runs".split()


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 40)))) for _ in range(n)]


def test_plan_batches_sorts_by_length_and_respects_the_budget():
    lengths = np.array([5, 50, 3, 40, 7, 2, 100])
    batches = plan_batches(lengths, batch_tokens=100, max_batch=3)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(7))  # every row exactly once
    for b in batches:
        assert len(b) <= 3
        assert len(b) == 1 or lengths[b].max() * len(b) <= 100
    assert [lengths[b].max() for b in batches] == sorted(lengths[b].max() for b in batches)
    # a single text longer than the budget gets a batch of its own, not dropped
    assert any(len(b) == 1 and lengths[b[0]] == 100 for b in batches)


def test_extract_restores_corpus_order_and_matches_embed(bert_export, tmp_path):
    texts = corpus(300)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    report = extract(bert_export, str(path), tmp_path / "store", engine="ort", layers="all",
                     poolings=["mean", "cls"], batch_tokens=256)
    store = LayerStore.open(tmp_path / "store")
    assert store.n == 300 and store.complete
    assert store.texts() == texts and store.ids() == [str(i) for i in range(300)]
    assert report.engine["provider"] == "CPUExecutionProvider"
    # each row equals the same text embedded on its own (order restored, no shift)
    handle = ModelHandle.resolve(bert_export)
    engine = create_engine("torch", handle)
    for i in (0, 17, 299):
        one = embed(handle, [texts[i]], engine=engine, layers="all", poolings=["mean"])
        for layer in store.layers:
            np.testing.assert_allclose(store["mean", layer][i], one["mean", layer][0], atol=1e-4)
    assert store["mean", -1].shape == (300, handle.manifest.hidden_size)
    np.testing.assert_array_equal(store["mean", -1], store["mean", str(handle.manifest.num_layers)])


def test_empty_lines_are_kept_and_counted_and_long_texts_truncated(bert_export, tmp_path):
    long = " ".join(["word"] * 500)
    path = tmp_path / "c.txt"
    path.write_text("first\n\n   \n" + long + "\nlast\n", encoding="utf-8")
    report = extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["mean"])
    assert report.n == 5 and report.empty == 2 and report.truncated == 1
    assert any("2 of 5 texts are empty" in w for w in report.warnings)
    assert any("1 of 5 texts are longer than" in w for w in report.warnings)
    arr = LayerStore.open(tmp_path / "s")["mean", -1]
    assert np.isfinite(arr).all() and (np.linalg.norm(arr, axis=1) > 0).all()


def test_interrupted_extraction_resumes_to_an_identical_store(bert_export, tmp_path):
    texts = corpus(400, seed=1)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    full = extract(bert_export, str(path), tmp_path / "full", engine="ort", poolings=["mean", "max"],
                   batch_tokens=128).store

    class Interrupt:
        def __init__(self, total_rows, total_tokens):
            self.batches = 0

        def advance(self, rows, tokens):
            self.batches += 1
            if self.batches == 7:
                raise KeyboardInterrupt

        def close(self):
            pass

    with pytest.raises(Interrupted, match=r"interrupted: \d+ of 400 rows done; continue with --resume"):
        extract(bert_export, str(path), tmp_path / "part", engine="ort", poolings=["mean", "max"],
                batch_tokens=128, progress=Interrupt)
    with pytest.raises(StoreError, match="incomplete"):
        LayerStore.open(tmp_path / "part")
    partial = LayerStore.open(tmp_path / "part", allow_incomplete=True)
    kept = int(partial.done_mask().sum())
    assert 0 < kept < 400
    with pytest.raises(InputError, match="--resume"):
        extract(bert_export, str(path), tmp_path / "part", engine="ort", poolings=["mean", "max"])
    report = extract(bert_export, str(path), tmp_path / "part", engine="ort", poolings=["mean", "max"],
                     batch_tokens=128, resume=True)
    assert report.resumed_rows == kept
    resumed = LayerStore.open(tmp_path / "part")
    assert resumed.texts() == full.texts()
    for p in ("mean", "max"):
        for layer in full.layers:
            np.testing.assert_array_equal(resumed[p, layer], full[p, layer])


# The child runs the real CLI; its engine is the real ORT engine wrapped so that, once 70 batches came
# back (the pipeline commits at 64 pending batches, or every 2 s), the next batch stalls until the child
# is killed. The kill therefore always lands mid-run, after a commit, with written but uncommitted rows.
_CHILD = """
import sys, time
import layerscope.extraction.pipeline as pipeline
from layerscope.engines.base import Engine

real_create = pipeline.open_engine

class StallAfter70(Engine):
    def __init__(self, inner):
        super().__init__(inner.model)
        self.inner, self.name, self.info = inner, inner.name, inner.info
        self.preferred_batch_tokens = inner.preferred_batch_tokens
        self.calls = 0

    def encoder(self, max_length=None, prompt=""):
        return self.inner.encoder(max_length, prompt)

    def run(self, batch, layers, poolings):
        self.calls += 1
        if self.calls > 70:
            time.sleep(600)  # killed long before this returns
        return self.inner.run(batch, layers, poolings)

    def run_tokens(self, batch, layers):
        return self.inner.run_tokens(batch, layers)

pipeline.open_engine = lambda *a, **k: StallAfter70(real_create(*a, **k))
from layerscope.cli import main
main(sys.argv[1:])
"""


def test_killed_process_resumes_to_an_identical_store(bert_export, tmp_path):
    """SIGKILL mid-run, then --resume: no row lost, duplicated or shifted.

    Catches: dropping the pipeline's periodic commit in extraction/pipeline.py (``len(pending) >= 64`` /
    2 s timer: a killed run then keeps nothing, so ``0 < kept`` fails), and the test's own old hole: a
    child killed before its first commit or after its last passed vacuously (now 0 < kept < n and the
    resumed run must report ``resumed_rows == kept``)."""
    texts = corpus(3000, seed=2)
    path = tmp_path / "c.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "killed"
    cmd = [sys.executable, "-c", _CHILD, "extract", "--model", str(bert_export), "--engine", "ort",
           "--input", str(path), "--out", str(out), "--batch-tokens", "64", "--pooling", "mean"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    marked = 0
    try:
        while time.time() < deadline and proc.poll() is None:
            done = out / "done.npy"
            if done.exists():
                try:
                    marked = int(np.load(done, mmap_mode="r").sum())
                except (ValueError, OSError):
                    marked = 0
                if marked > 0:
                    break
            time.sleep(0.05)
    finally:
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    assert alive, f"the child exited by itself (rc {proc.returncode}): {err.decode()[-500:]}"
    partial = LayerStore.open(out, allow_incomplete=True)
    kept = int(partial.done_mask().sum())
    assert 0 < kept < 3000, kept
    report = extract(bert_export, str(path), out, engine="ort", poolings=["mean"], batch_tokens=64, resume=True)
    assert report.resumed_rows == kept
    meta = LayerStore.open(out).meta  # what this call did, apart from the engine start: rates of long runs
    assert meta["run_rows"] == 3000 - kept and meta["run_tokens"] == report.tokens
    assert 0 < meta["run_seconds"] <= meta["seconds"]
    reference = extract(bert_export, str(path), tmp_path / "ref", engine="ort", poolings=["mean"],
                        batch_tokens=64).store
    resumed = LayerStore.open(out)
    for layer in reference.layers:
        arr = np.asarray(resumed["mean", layer])
        assert (np.abs(arr).max(axis=1) > 0).all(), f"all-zero rows at layer {layer}"
        np.testing.assert_array_equal(arr, reference["mean", layer])


def test_resume_refuses_a_store_made_with_other_settings(bert_export, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a\nb\nc\n", encoding="utf-8")
    extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["mean"])
    with pytest.raises(StoreError, match="poolings"):
        extract(bert_export, str(path), tmp_path / "s", engine="ort", poolings=["cls"], resume=True)


def test_float16_store(bert_export, tmp_path):
    texts = corpus(20)
    s32 = extract(bert_export, texts, tmp_path / "a", engine="ort", poolings=["mean"]).store
    s16 = extract(bert_export, texts, tmp_path / "b", engine="ort", poolings=["mean"], dtype="float16").store
    # stored as float16 (half the disk), read back as float32 by every reader
    assert s16.raw(("mean", -1)).dtype == np.float16 and s16["mean", -1].dtype == np.float32
    np.testing.assert_allclose(s16["mean", -1].astype(np.float32), s32["mean", -1], rtol=2e-3, atol=2e-3)
    assert s16.dtype == "float16"


@pytest.mark.parametrize("layers, message", [("9", "out of range"), ("-12", "out of range"), ("x", "not a layer")])
def test_bad_layers(bert_export, tmp_path, layers, message):
    with pytest.raises(InputError, match=message):
        extract(bert_export, ["a b"], tmp_path / "s", engine="ort", layers=layers)
    assert not (tmp_path / "s" / "store.json").exists()


def test_bad_pooling_and_eos_without_pooled_output(bert_export, tmp_path):
    with pytest.raises(InputError, match="did you mean 'mean'"):
        extract(bert_export, ["a"], tmp_path / "s", engine="ort", poolings=["maen"])
    with pytest.raises(InputError, match="eos"):
        extract(bert_export, ["a"], tmp_path / "s2", engine="ort", poolings=["eos"])


def test_empty_corpus(bert_export, tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="empty"):
        extract(bert_export, str(path), tmp_path / "s", engine="ort")
    assert not (tmp_path / "s" / "store.json").exists()


@pytest.mark.parametrize("kwargs,message", [({"layers": "0,99"}, "99"), ({"poolings": ["eos"]}, "pooling 'eos' needs"),
                                            ({"poolings": ["maen"]}, "did you mean 'mean'"),
                                            ({"prompt_name": "query"}, "query")])
def test_embed_refuses_what_extract_refuses_before_any_engine_starts(bert_export, monkeypatch, kwargs, message):
    """Catches: embed (what every analysis runs) opening the engine first, so a typo in --layers surfaced only
    after a big model's engine had loaded for minutes, and embed skipping extract's eos check."""
    import layerscope.extraction.pipeline as pipeline

    def no_engine(*args, **kw):
        raise AssertionError("the engine was started before the request was checked")

    monkeypatch.setattr(pipeline, "open_engine", no_engine)
    with pytest.raises(InputError, match=message):
        embed(str(bert_export), ["a sentence"], engine="ort", **kwargs)
