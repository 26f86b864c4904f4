"""OpenVINO's throughput mode: two batches in flight give the one-request path's vectors, really run at once,
and are chosen from the speeds layerscope bench recorded on this CPU, never by default."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("openvino")

from layerscope.extraction.batching import iter_pooled  # noqa: E402

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought apples", "two dogs near the lake", "embedding models turn sentences into vectors",
         "the cat sat", "Water boils at 100 degrees Celsius at sea level.", "ok"] * 3


def _vectors(eng, layers) -> np.ndarray:
    out = np.zeros((len(layers), len(TEXTS), eng.manifest.hidden_size), np.float32)
    for batch, pooled, _ in iter_pooled(eng, TEXTS, layers, ["mean"], batch_tokens=24):
        out[:, batch.index] = pooled["mean"]
    return out


def test_two_in_flight_give_the_one_request_vectors(bert_export):
    from layerscope.export.open import open_engine

    one = open_engine(bert_export, "ov", requests=1)
    two = open_engine(bert_export, "ov", requests=2)
    assert one.requests == 1 and two.requests == 2
    assert two.session.compiled.get_property("NUM_STREAMS") == 2
    layers = one.layer_names
    a, b = _vectors(one, layers), _vectors(two, layers)
    assert np.isfinite(a).all() and np.abs(a).max() > 0
    np.testing.assert_array_equal(a, b)


def test_two_batches_really_are_in_flight_at_once(bert_export, monkeypatch):
    from layerscope.engines.ov import OvSession
    from layerscope.export.open import open_engine

    eng = open_engine(bert_export, "ov", requests=2)
    # the first two batches meet at a barrier inside the session: one at a time, the first waits alone and fails
    meet = threading.Barrier(2, timeout=10)
    real = OvSession.run
    calls: list[int] = []

    def run(self, names, feed):
        calls.append(1)
        if len(calls) <= 2:
            meet.wait()
        return real(self, names, feed)

    monkeypatch.setattr(OvSession, "run", run)
    got = list(iter_pooled(eng, TEXTS, eng.layer_names, ["mean"], batch_tokens=24))
    assert len(calls) == len(got) > 2
    order = [int(i) for batch, _, _ in got for i in batch.index]
    assert sorted(order) == list(range(len(TEXTS)))


def _record(tmp_path, speeds: dict[str, float], manifest) -> None:
    from layerscope.engines.speed_order import record

    bench = {"kind": "layerscope-bench-isolated", "corpus": {"texts": 2758, "name": "sts-test"},
             "model": {"source": "tiny", "onnx_sha256": manifest.onnx_sha256},
             "results": [{"engine": k, "texts_per_s": v, "available": True, "kind": "engine"} for k, v in speeds.items()]}
    assert record(bench, root=tmp_path) == len(speeds)


@pytest.mark.parametrize("speeds,want", [
    ({"ov": 400.0, "ov-x2": 610.0}, 2),  # measured faster with two in flight
    ({"ov": 400.0, "ov-x2": 380.0}, 1),  # measured slower
    ({"ov": 400.0}, 1),  # two in flight never measured: one, as before
])
def test_requests_follow_the_recorded_speeds(bert_export, tmp_path, monkeypatch, speeds, want):
    from layerscope.engines import speed_order
    from layerscope.export.open import open_engine
    from layerscope.model.handle import ModelHandle

    manifest = ModelHandle.resolve(bert_export).manifest
    _record(tmp_path, speeds, manifest)
    monkeypatch.setattr(speed_order, "_root", lambda: tmp_path)
    eng = open_engine(bert_export, "ov")
    assert eng.requests == want
    notes = " ".join(eng.info.notes)
    if "ov-x2" in speeds:
        assert f"ov-x2 at {speeds['ov-x2']:,.0f} texts/s and ov at 400" in notes, notes
    # auto ranks ov by the figure it will run at
    ranked = speed_order.with_in_flight(speeds)
    assert ranked["ov"] == max(speeds.values())


def test_requests_follow_this_exports_record_over_a_later_one_of_another(bert_export, tmp_path, monkeypatch):
    from dataclasses import replace

    from layerscope.engines import speed_order
    from layerscope.engines.ov import in_flight
    from layerscope.model.handle import ModelHandle

    manifest = ModelHandle.resolve(bert_export).manifest
    _record(tmp_path, {"ov": 400.0, "ov-x2": 610.0}, manifest)
    _record(tmp_path, {"ov": 400.0, "ov-x2": 300.0}, replace(manifest, onnx_sha256="b" * 64))  # later, another
    monkeypatch.setattr(speed_order, "_root", lambda: tmp_path)
    assert in_flight(manifest, "fp32", None)[0] == 2  # its own export's record, not the latest one
    assert in_flight(replace(manifest, onnx_sha256="c" * 64), "fp32", None)[0] == 1  # none: the latest


def test_requests_outside_one_or_two_are_refused(bert_export):
    from layerscope.errors import InputError
    from layerscope.export.open import open_engine

    with pytest.raises(InputError, match="keeps 1 or 2 batches in flight"):
        open_engine(bert_export, "ov", requests=3)
