"""Long texts: a text longer than the batch's token budget is extracted whole in a batch of its own on every
CPU engine, with the vectors of a plain Hugging Face forward of that text alone; what ``--max-length`` cuts is
said before the first batch and counted in the store; a text that cannot fit in memory is refused first."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from layerscope.errors import InputError
from layerscope.extraction import batching
from layerscope.extraction.pipeline import extract
from layerscope.store.store import LayerStore

LONG = " ".join(["the quick brown fox jumps over the lazy dog while a cat sat on the mat"] * 3)
TEXTS = ["a cat sat on the mat", LONG, "hi", "the dog runs", "Water boils at 100 degrees Celsius."]
BUDGET = 16  # padded tokens per batch: the long text alone is several times this


def hf_mean(model_dir, texts: list[str], max_length: int | None = None) -> dict[str, np.ndarray]:
    """Mean-pooled hidden states of each text run alone (no padding) by transformers itself:
    {"0".."L": [n, hidden]} in float64."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModel.from_pretrained(str(model_dir)).eval()
    rows: dict[str, list[np.ndarray]] = {}
    for text in texts:
        enc = tok([text], return_tensors="pt", truncation=max_length is not None, max_length=max_length)
        with torch.no_grad():
            states = net(**enc, output_hidden_states=True).hidden_states
        for i, h in enumerate(states):
            rows.setdefault(str(i), []).append(h[0].double().mean(0).numpy())
    return {k: np.stack(v) for k, v in rows.items()}


@pytest.fixture(scope="module")
def reference(tiny_model):
    return hf_mean(tiny_model("bert"), TEXTS)


@pytest.mark.parametrize("engine", ["ort", "ov", "torch"])
def test_a_text_longer_than_the_batch_budget_gives_the_hf_vectors(engine, bert_export, tiny_model, reference,
                                                                   tmp_path, monkeypatch):
    if engine == "ov":
        pytest.importorskip("openvino")
    planned: list[list[int]] = []
    real_plan = batching.plan_batches

    def spy(lengths, **kw):
        batches = real_plan(lengths, **kw)
        planned.extend([list(np.asarray(lengths)[b]) for b in batches])
        return batches

    monkeypatch.setattr(batching, "plan_batches", spy)
    model = tiny_model("bert") if engine == "torch" else bert_export
    rep = extract(model, TEXTS, tmp_path / "s", engine=engine, layers="all", poolings=["mean"],
                  batch_tokens=BUDGET)
    store = LayerStore.open(tmp_path / "s")
    long_tokens = max(max(b) for b in planned)
    assert long_tokens > 4 * BUDGET  # the text really is longer than the budget
    assert [long_tokens] in planned  # and ran alone, whole
    assert rep.truncated == 0 and store.record.truncated_texts == 0
    for layer, want in reference.items():
        got = np.asarray(store["mean", layer], dtype=np.float64)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=0, err_msg=f"{engine} layer {layer}")


def test_max_length_cuts_are_said_before_the_run_and_counted(bert_export, tiny_model, tmp_path, monkeypatch):
    from layerscope.engines.ort import OrtEngine

    events: list[str] = []
    real_run = OrtEngine.run

    def run(self, batch, layers, poolings):
        events.append("batch")
        return real_run(self, batch, layers, poolings)

    class Said(logging.Handler):
        def emit(self, record):
            events.append(record.getMessage())

    monkeypatch.setattr(OrtEngine, "run", run)
    logger = logging.getLogger("layerscope")
    said = Said(logging.WARNING)
    logger.addHandler(said)
    try:
        rep = extract(bert_export, TEXTS, tmp_path / "s", engine="ort", layers="all", poolings=["mean"],
                      max_length=8)
    finally:
        logger.removeHandler(said)
    cut_by_hand = 3  # the long text, "a cat sat on the mat" and the Celsius line pass 8 tokens with [CLS]/[SEP]
    lines = [i for i, e in enumerate(events) if "longer than 8 tokens" in e]
    assert lines, events
    assert events[lines[0]].startswith(f"{cut_by_hand} of 5 texts are longer than 8 tokens and will be truncated")
    assert lines[0] < events.index("batch")  # said before the first batch runs
    store = LayerStore.open(tmp_path / "s")
    assert rep.truncated == cut_by_hand and store.record.truncated_texts == cut_by_hand
    assert any(w.startswith(f"{cut_by_hand} of 5 texts are longer than 8 tokens") for w in rep.warnings)
    want = hf_mean(tiny_model("bert"), TEXTS, max_length=8)
    for layer, ref in want.items():
        np.testing.assert_allclose(np.asarray(store["mean", layer], np.float64), ref, atol=2e-5, rtol=0)


def test_a_text_too_long_for_memory_is_refused_before_any_batch(bert_export, tmp_path, monkeypatch):
    from layerscope.engines import memory

    # the tiny BERT (4 heads, 32 wide, 2 layers) at the long text's length, by hand: attention 2*4*T*T floats,
    # feed-forward 4 * T * 32 floats, and the hidden states: one layer's (T * 32) where an engine pools each
    # layer as it is made, else raw and layers 0..2, (2 + 2) * T * 32
    tokens = 98
    one_layer = (2 * 4 * tokens * tokens + tokens * 32 + 4 * tokens * 32) * 4
    every_state = (2 * 4 * tokens * tokens + 4 * tokens * 32 + 4 * tokens * 32) * 4
    assert memory.text_cost(tokens, hidden_size=32, heads=4, depth=2, layer_at_a_time=True).bytes == one_layer
    assert memory.text_cost(tokens, hidden_size=32, heads=4, depth=2, layer_at_a_time=False).bytes == every_state
    assert memory.longest_that_fits(one_layer, hidden_size=32, heads=4, depth=2, layer_at_a_time=True) == tokens
    # a mean extraction of every layer on ort runs the export's own graph (no derived copy of the whole model),
    # which holds every layer's states at once; one byte short for the long text
    monkeypatch.setattr(memory, "available_bytes", lambda: every_state - 1)
    ran: list[int] = []
    from layerscope.engines.ort import OrtEngine

    monkeypatch.setattr(OrtEngine, "run", lambda self, *a: ran.append(1))
    with pytest.raises(InputError) as exc:
        extract(bert_export, TEXTS, tmp_path / "s", engine="ort", layers="all", poolings=["mean"])
    assert ran == []
    msg = str(exc.value)
    assert msg.startswith(f"the longest text has {tokens} tokens") and "--max-length 97 or less" in msg, msg
    assert not (tmp_path / "s").exists()  # nothing stored, nothing left behind


def test_heads_are_read_from_the_config(tmp_path):
    from layerscope.engines.memory import attention_heads

    (tmp_path / "config.json").write_text('{"text_config": {"num_attention_heads": 12}}', encoding="utf-8")
    assert attention_heads(tmp_path, 768) == 12
    assert attention_heads(tmp_path / "nowhere", 1024) == 16  # 1024 // 64 where no config says
