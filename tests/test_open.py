"""layerscope.open: one engine for many calls, results keyed by the caller's layer names."""

from __future__ import annotations

import numpy as np
import pytest

import layerscope
from layerscope.errors import InputError

TEXTS = ["a cat sat on the mat", "the weather today is sunny", "water boils"]


def test_open_keeps_its_engine_and_the_callers_layer_names(tiny_model, monkeypatch):
    import layerscope.engines.base as base
    from layerscope.extraction.pipeline import embed

    made = []
    real = base.create_engine
    import layerscope.extraction.pipeline as pipeline

    counting = lambda *a, **k: made.append(a) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(base, "create_engine", counting)
    real_open = pipeline.open_engine  # embed() given no engine would open one here: counted too
    monkeypatch.setattr(pipeline, "open_engine", lambda *a, **k: made.append(a) or real_open(*a, **k))
    model = layerscope.open(str(tiny_model("bert")), engine="torch")
    first = model.embed(TEXTS, layers=[-1, 0], poolings=["mean", "cls"])
    second = model.embed(TEXTS[:1], layers="raw,-1", poolings="mean")
    assert len(made) == 1  # the engine is made once, not per call
    assert set(first) == {("mean", -1), ("mean", 0), ("cls", -1), ("cls", 0)}
    assert set(second) == {("mean", "raw"), ("mean", "-1")}
    ref = embed(str(tiny_model("bert")), TEXTS, engine="torch", layers="all", poolings=["mean", "cls"])
    np.testing.assert_allclose(first["mean", -1], ref["mean", "2"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(first["cls", 0], ref["cls", "0"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second["mean", "-1"][0], ref["mean", "2"][0], rtol=1e-5, atol=1e-6)
    ranged = model.embed(TEXTS, layers="1:2", poolings=["mean"])
    assert set(ranged) == {("mean", "1"), ("mean", "2")}
    assert model.encode(TEXTS).shape == (3, model.hidden_size)
    np.testing.assert_allclose(model.encode(TEXTS), ref["mean", "2"], rtol=1e-5, atol=1e-6)
    model.close()


def test_open_rejects_a_bad_layer_with_one_line(tiny_model):
    with layerscope.open(str(tiny_model("bert")), engine="torch") as model:
        with pytest.raises(InputError, match="out of range"):
            model.embed(TEXTS, layers=[9])


@pytest.mark.parametrize("engine", ["torch", "ort"])
def test_embed_after_close_says_the_model_is_closed(engine, tiny_model):
    model = layerscope.open(str(tiny_model("bert")), engine=engine)
    assert model.encode(TEXTS[:1]).shape == (1, model.hidden_size)
    model.close()
    with pytest.raises(InputError, match=r"closed.*layerscope\.open"):
        model.embed(TEXTS)
    with pytest.raises(InputError, match="closed"):
        model.encode(TEXTS)
    model.close()  # a second close is harmless
    with layerscope.open(str(tiny_model("bert")), engine=engine) as again:
        pass
    with pytest.raises(InputError, match="closed"):
        again.embed(TEXTS)
