"""The tokenizer pool: started only where a recorded measurement says one tokenizer cannot keep the engine fed,
the fewest processes recorded to keep up; its batches and the vectors extracted from them are the thread's."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.model import tokenize_pool
from layerscope.model.tokenize_pool import TokenizerPool, processes_for, record

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought apples", "two dogs near the lake", "embedding models turn sentences into vectors",
         "the cat sat", "Water boils at 100 degrees Celsius at sea level.", "ok"] * 4


@pytest.mark.parametrize("engine_rate,rates,want", [
    (50_000, {1: 20_000, 2: 38_000, 4: 61_000}, 4),  # only four keep up
    (30_000, {1: 20_000, 2: 38_000, 4: 61_000}, 2),  # two do: the fewest that keep up
    (90_000, {1: 20_000, 2: 38_000, 4: 61_000}, 4),  # none keeps up: the fastest count
    (15_000, {1: 20_000, 2: 38_000, 4: 61_000}, 1),  # one keeps up: no processes
])
def test_processes_follow_the_recorded_rates(tmp_path, engine_rate, rates, want):
    record("w" * 64, "ort", engine_rate, rates, cpu="cpu-a", root=tmp_path)
    got, why = processes_for("w" * 64, "ort", cpu="cpu-a", root=tmp_path)
    assert got == want
    assert (why is None) == (want == 1)
    if why:
        assert f"one tokenizes {rates[1]:,.0f} tokens/s here and ort runs {engine_rate:,.0f}" in why


def test_no_record_no_pool(tmp_path):
    record("w" * 64, "ort", 50_000, {1: 20_000, 2: 38_000}, cpu="cpu-a", root=tmp_path)
    assert processes_for("w" * 64, "ov", cpu="cpu-a", root=tmp_path) == (1, None)  # another engine
    assert processes_for("v" * 64, "ort", cpu="cpu-a", root=tmp_path) == (1, None)  # another model
    assert processes_for("w" * 64, "ort", cpu="cpu-b", root=tmp_path) == (1, None)  # another CPU
    assert processes_for(None, "ort", cpu="cpu-a", root=tmp_path) == (1, None)


def test_pool_batches_equal_the_threads(bert_export):
    from layerscope.export.open import open_engine
    from layerscope.extraction.batching import encode_plan

    eng = open_engine(bert_export, "ort")
    enc = eng.encoder()
    lengths = enc.token_lengths(TEXTS)
    plain = list(encode_plan(enc, TEXTS, lengths, batch_tokens=24, max_batch=8))
    with TokenizerPool(enc, 2) as pool:
        pooled = list(encode_plan(enc, TEXTS, lengths, batch_tokens=24, max_batch=8, pool=pool))
    assert len(plain) == len(pooled) > 3
    for a, b in zip(plain, pooled):
        np.testing.assert_array_equal(a.index, b.index)
        assert a.inputs.keys() == b.inputs.keys()
        for k in a.inputs:
            np.testing.assert_array_equal(a.inputs[k], b.inputs[k])


def test_extraction_with_a_recorded_need_runs_the_pool(bert_export, tmp_path, monkeypatch):
    from layerscope.engines.speed_order import cpu_identity
    from layerscope.model.handle import ModelHandle
    from layerscope.extraction.pipeline import extract
    from layerscope.store.store import LayerStore

    plain = extract(bert_export, TEXTS, tmp_path / "plain", engine="ort", layers="all", batch_tokens=24)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    key = ModelHandle.resolve(bert_export).manifest.source.weights_sha256
    record(key, "ort", 80_000, {1: 20_000, 2: 41_000}, cpu=cpu_identity()[0])  # the cache root of this run
    used: list[int] = []
    real_map = TokenizerPool.map
    monkeypatch.setattr(TokenizerPool, "map", lambda self, jobs: used.append(self.processes) or real_map(self, jobs))
    extract(bert_export, TEXTS, tmp_path / "pooled", engine="ort", layers="all", batch_tokens=24)
    assert used == [2]  # two recorded as enough: the pool ran, with two processes
    a, b = LayerStore.open(tmp_path / "plain"), LayerStore.open(tmp_path / "pooled")
    for layer in a.layers:
        np.testing.assert_array_equal(np.asarray(a["mean", layer]), np.asarray(b["mean", layer]))
    assert plain.n == len(TEXTS)


def test_measure_counts_every_token(bert_export):
    from layerscope.export.open import open_engine

    enc = open_engine(bert_export, "ort").encoder()
    lengths = enc.token_lengths(TEXTS)
    jobs = [(TEXTS[:5], np.arange(5), lengths[:5]), (TEXTS[5:], np.arange(5, len(TEXTS)), lengths[5:])]
    ticks = iter([10.0, 12.0])  # two seconds for the one-process pass
    rates = tokenize_pool.measure(enc, jobs, counts=(1,), clock=lambda: next(ticks))
    assert rates == {1: int(np.minimum(lengths, enc.max_length).sum()) / 2.0}
