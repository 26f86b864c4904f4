"""In-memory vectors take the same layer keys as a LayerStore: ("mean", 2), ("mean", -1) and ("mean", "2")."""

from __future__ import annotations

import numpy as np

TEXTS = ["a cat sat on the mat", "the train leaves at noon"]


def test_embed_all_layers_takes_store_keys(bert_export, tmp_path):
    import layerscope
    from layerscope.extraction.pipeline import embed, extract

    got = embed(str(bert_export), TEXTS, engine="ort", layers="all", poolings=["mean"])
    store = extract(str(bert_export), TEXTS, tmp_path / "s", engine="ort", layers="all", poolings=["mean"]).store
    for key in (("mean", 2), ("mean", -1), ("mean", "2"), ("mean", "-1"), ("mean", 0), ("mean", "raw"),
                ("mean", -3)):
        assert key in got
        np.testing.assert_allclose(got[key], store[key], atol=1e-6)
    assert ("mean", 3) not in got and ("cls", 2) not in got and got.get(("mean", 9)) is None
    model = layerscope.open(str(bert_export), engine="ort")
    try:
        opened = model.embed(TEXTS, layers="all", poolings=["mean"])
        np.testing.assert_allclose(opened["mean", -1], store["mean", 2], atol=1e-6)
        np.testing.assert_allclose(opened["mean", 1], store["mean", "1"], atol=1e-6)
    finally:
        close = getattr(model, "close", None)
        if close:
            close()
