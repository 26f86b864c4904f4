"""The memory floor of a pooled run follows what the engine declares: the PyTorch engines pool each layer as the
model makes it (hooks on the blocks, engines/torch_pooled.py) and hold one layer's states, as do the exported graphs
opened for pooled vectors only (their pooling follows each layer), while a graph handing hidden states back holds
every layer; so a long text that fits torch's pooled-only memory runs,
and a longer one is still refused in one line before any batch."""

from __future__ import annotations

import numpy as np
import pytest

from layerscope.engines import memory
from layerscope.engines.base import create_engine
from layerscope.errors import InputError
from layerscope.extraction.pipeline import extract
from layerscope.model.handle import ModelHandle

LONG = " ".join(["the quick brown fox jumps over the lazy dog while a cat sat on the mat"] * 3)
TEXTS = ["a cat sat on the mat", LONG, "hi", "the dog runs", "Water boils at 100 degrees Celsius."]
LONGEST = 98  # the long text's tokens with [CLS] and [SEP] (tests/extraction/test_long_texts.py)


def by_hand(tokens: int, layers_alive: int) -> int:
    """The tiny BERT's floor (4 heads, 32 wide, eager attention): attention 2*4*T*T, ``layers_alive`` layers'
    states T*32 each, the feed-forward 4*T*32; fp32 floats."""
    return (2 * 4 * tokens * tokens + layers_alive * tokens * 32 + 4 * tokens * 32) * 4


def test_torch_pooled_only_is_charged_one_layer_below_ort_pooled(tiny_model, bert_export):
    from layerscope.engines.registry import resolve_engine

    handle = ModelHandle.resolve(str(tiny_model("bert")))
    torch_eng = create_engine("torch", handle, device="cpu")
    ort_eng = create_engine("ort", ModelHandle.resolve(str(bert_export)))
    torch_floor = memory.shape_of(torch_eng).cost(LONGEST).bytes
    ort_floor = memory.shape_of(ort_eng).cost(LONGEST).bytes
    assert torch_floor == by_hand(LONGEST, 1)  # one layer alive at a time, in the hooks
    assert ort_floor == by_hand(LONGEST, 4)  # raw and layers 0..2, stacked by the in-graph pooling
    assert torch_floor < ort_floor
    # ort opened for pooled vectors only below the last layer runs a derived graph whose pooling follows each layer
    # (engines/layer_pooling.py); for every layer it runs the export's own graph, whose pooling stacks them
    ort_pooled = create_engine("ort", ModelHandle.resolve(str(bert_export)), depth=1, pooled_only=True)
    assert memory.shape_of(ort_pooled).cost(LONGEST).bytes == by_hand(LONGEST, 1)
    assert memory.shape_of(ort_pooled, tokens=True).cost(LONGEST).bytes == by_hand(LONGEST, 3)
    every = create_engine("ort", ModelHandle.resolve(str(bert_export)), pooled_only=True)
    assert memory.shape_of(every).cost(LONGEST).bytes == by_hand(LONGEST, 4)
    export = ModelHandle.resolve(str(bert_export))
    for depth, alive in ((1, 1), (None, 4)):  # the plan before the engine starts says the same
        planned = memory.shape_planned(export, resolve_engine("ort"), depth=depth, tokens=False, max_seq=None,
                                       pooled_only=True)
        assert planned.cost(LONGEST).bytes == by_hand(LONGEST, alive), depth
    # a run of token states holds every layer on torch too; the plan before the engine starts says the same
    assert memory.shape_of(torch_eng, tokens=True).cost(LONGEST).bytes == by_hand(LONGEST, 4)
    planned = memory.shape_planned(handle, resolve_engine("torch"), depth=None, tokens=False, max_seq=None)
    assert planned.cost(LONGEST).bytes == torch_floor
    # an early exit at layer 0 keeps no block for the hooks to sit on: every state it reads is charged
    shallow = create_engine("torch", handle, device="cpu", depth=0)
    assert not shallow.pools_as_made and memory.shape_of(shallow).cost(LONGEST).bytes == by_hand(LONGEST, 2)


def test_a_long_text_that_fits_torch_pooled_memory_runs_and_a_longer_one_gets_its_line(tiny_model, tmp_path,
                                                                                       monkeypatch):
    from layerscope.engines.torch import TorchEngine
    from layerscope.store.store import LayerStore

    model = str(tiny_model("bert"))
    monkeypatch.setattr(memory, "available_bytes", lambda: by_hand(LONGEST, 1))  # exactly torch's pooled floor
    rep = extract(model, TEXTS, tmp_path / "fits", engine="torch", layers="all", poolings=["mean"])
    store = LayerStore.open(rep.store.path)
    assert store.complete and np.isfinite(np.asarray(store["mean", "2"])).all()
    monkeypatch.setattr(memory, "available_bytes", lambda: by_hand(LONGEST, 1) - 1)
    ran: list[int] = []
    real = TorchEngine.run
    monkeypatch.setattr(TorchEngine, "run", lambda self, *a: ran.append(1) or real(self, *a))
    with pytest.raises(InputError) as exc:
        extract(model, TEXTS, tmp_path / "short", engine="torch", layers="all", poolings=["mean"])
    msg = str(exc.value)
    assert msg.startswith(f"the longest text has {LONGEST} tokens") and "engine 'torch'" in msg, msg
    assert "--max-length 97 or less" in msg and "\n" not in msg, msg
    assert ran == [] and not (tmp_path / "short").exists()
