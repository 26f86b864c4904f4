"""Attention in blocks of query rows on ONNX Runtime (engines/blocked.py): a decoder's derived graph computes
each layer's attention over blocks of ``BLOCK_ROWS`` query rows, holds no ``[heads, T, T]`` tensor, gives the
whole-attention graph's vectors on a text longer than the batch budget and several blocks long, and the memory
check charges it ``2 * heads * T * rows`` floats instead of ``2 * heads * T * T``."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from layerscope.engines.base import create_engine
from layerscope.engines.blocked import pick_blocks
from layerscope.engines.blocked_graph import BLOCK_ROWS
from layerscope.engines.memory import check_longest_text, text_cost
from layerscope.errors import InputError

HEADS, KV_HEADS, HIDDEN, LAYERS = 4, 2, 32, 2  # the tiny decoders (tests/tiny_models.py)
LONG = " ".join(["the quick brown fox jumps over the lazy dog while a cat sat on the mat"] * 3)
TEXTS = ["a cat sat on the mat", LONG, "hi", "Water boils at 100 degrees Celsius."]


@pytest.fixture(scope="module")
def qwen3(tiny_export):
    return tiny_export("qwen3", pooled=["mean"])


def _hf_states(model_dir, text: str) -> list[np.ndarray]:
    """Every hidden state of ``text`` alone by transformers itself (eager attention), float64."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    with torch.no_grad():
        out = net(**tok([text], return_tensors="pt"), output_hidden_states=True)
    return [h[0].double().numpy() for h in out.hidden_states]


def _main_graph_ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def _largest_node_output(eng, batch) -> int:
    """The largest output (bytes) of any node ONNX Runtime ran for ``batch``, the nodes inside loops included,
    read from its profile."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(eng.model.export_dir / "profile")
    session = ort.InferenceSession(str(eng.graph_path), opts, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    session.run(None, {k: v for k, v in batch.inputs.items() if k in inputs})
    events = json.loads(open(session.end_profiling()).read())
    sizes = [int(e["args"]["output_size"]) for e in events
             if e.get("cat") == "Node" and "output_size" in e.get("args", {})]
    assert sizes
    return max(sizes)


@pytest.mark.parametrize("engine", ["ort", "ov"])
def test_blocks_give_the_whole_attention_vectors_and_hold_no_square(engine, qwen3, tiny_model):
    if engine == "ov":
        pytest.importorskip("openvino")
    whole = create_engine(engine, qwen3, attention="whole")
    blocked = create_engine(engine, qwen3, attention="blocked")
    assert (whole.attention, blocked.attention) == ("whole", "blocked")
    assert blocked.attention_rows == BLOCK_ROWS and whole.attention_rows is None
    assert any(n.startswith(f"attention in blocks of {BLOCK_ROWS} query rows ({LAYERS} layers)")
               for n in blocked.info.notes), blocked.info.notes
    derived = qwen3 / "model.blocked.onnx"
    ops = _main_graph_ops(derived)
    assert ops.count("Loop") == LAYERS and "Softmax" not in ops  # every layer's softmax is inside its blocks
    assert "LessOrEqual" not in ops and "LessOrEqual" in _main_graph_ops(qwen3 / "model.onnx")  # square mask gone

    long_batch = whole.encoder()([LONG])
    t = long_batch.input_ids.shape[1]
    assert BLOCK_ROWS < t < 2 * BLOCK_ROWS  # two blocks, the last one padded
    layers = whole.layer_names
    for batch in (long_batch, whole.encoder()(TEXTS)):  # alone, and right-padded among short texts
        want = whole.run_tokens(batch, layers)
        got = blocked.run_tokens(batch, layers)
        for layer, w, g in zip(layers, want, got):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=0, err_msg=f"layer {layer}")
    # and transformers' own eager forward of the long text
    numbered = [n for n in layers if n != "raw"]
    for layer, ref, got in zip(numbered, _hf_states(tiny_model("qwen3"), LONG),
                               blocked.run_tokens(long_batch, numbered), strict=True):
        np.testing.assert_allclose(got[0], ref, atol=2e-5, rtol=0, err_msg=f"layer {layer} vs transformers")
    # no op makes a [heads, T, T] tensor: the largest output of any node (ONNX Runtime's profile of the graph each
    # engine runs) is far below it
    square = HEADS * t * t * 4
    assert _largest_node_output(whole, long_batch) >= square
    assert _largest_node_output(blocked, long_batch) <= HEADS * BLOCK_ROWS * t * 4 < square


def test_a_text_longer_than_the_batch_budget_is_extracted_in_blocks(qwen3, tmp_path):
    from layerscope.extraction.pipeline import extract
    from layerscope.store.store import LayerStore

    stores = {}
    for attention in ("whole", "blocked"):
        rep = extract(qwen3, TEXTS, tmp_path / attention, engine="ort", layers="all", poolings=["mean"],
                      batch_tokens=16, engine_options={"attention": attention})
        notes = " ".join(rep.engine["notes"])
        assert ("attention in blocks" in notes) == (attention == "blocked"), notes
        stores[attention] = LayerStore.open(tmp_path / attention)
    for layer in ["0", "1", "2"]:
        np.testing.assert_allclose(stores["blocked"]["mean", layer], stores["whole"]["mean", layer], atol=1e-5,
                                   rtol=0, err_msg=f"layer {layer}")


def test_the_derived_graph_is_cached_with_its_check(qwen3):
    first = create_engine("ort", qwen3, attention="blocked")
    record = json.loads((qwen3 / "model.blocked.json").read_text())
    assert record["rows"] == BLOCK_ROWS and record["layers"] == LAYERS
    assert record["check"]["max_abs"] <= record["check"]["tolerance_abs"]
    again = create_engine("ort", qwen3, attention="blocked")
    assert any("cached" in n and "blocks" in n for n in again.info.notes), again.info.notes
    assert first.attention_rows == again.attention_rows == BLOCK_ROWS


def test_auto_blocks_long_runs_of_decoders_only(qwen3, bert_export):
    assert pick_blocks(None, 2048) and pick_blocks("auto", 1025) and pick_blocks("blocked", None)
    assert not pick_blocks(None, 1024) and not pick_blocks(None, None) and not pick_blocks("whole", 32768)
    with pytest.raises(InputError, match="attention='sliced'"):
        pick_blocks("sliced", 2048)
    assert create_engine("ort", qwen3, max_seq=4096).attention == "blocked"
    assert create_engine("ort", qwen3, max_seq=512).attention == "whole"
    encoder = create_engine("ort", bert_export, max_seq=4096)  # an encoder attends both ways: whole, said
    assert encoder.attention == "whole" and encoder.attention_rows is None
    assert any(n.startswith("attention computed whole") for n in encoder.info.notes), encoder.info.notes
    with pytest.raises(InputError, match="attention=blocked: .* cannot run its attention in blocks"):
        create_engine("ort", bert_export, attention="blocked")


def test_the_memory_check_charges_blocks_linearly(qwen3):
    t = 120
    # by hand, a text of t tokens on the tiny Qwen3 (4 heads, 32 wide, 2 layers, ort hands back raw and 0..2):
    # states 4 * t * 32, feed-forward 4 * t * 32, attention 2 * 4 * t * t whole or 2 * 4 * t * 64 in blocks
    states_ff = (4 * t * 32 + 4 * t * 32) * 4
    in_blocks = states_ff + 2 * 4 * t * 64 * 4
    assert text_cost(t, hidden_size=32, heads=4, depth=2, layer_at_a_time=False, attention_rows=64).bytes == in_blocks
    assert text_cost(8192, hidden_size=1024, heads=16, depth=28, layer_at_a_time=True, attention_rows=64).attention \
        == 2 * 16 * 8192 * 64 * 4
    assert text_cost(40, hidden_size=32, heads=4, depth=2, layer_at_a_time=False, attention_rows=64).attention \
        == 2 * 4 * 40 * 40 * 4  # a text shorter than one block holds its whole square
    whole = create_engine("ort", qwen3, attention="whole")
    blocked = create_engine("ort", qwen3, attention="blocked")
    assert check_longest_text(blocked, t, available=in_blocks).bytes == in_blocks
    with pytest.raises(InputError, match=f"the longest text has {t} tokens"):
        check_longest_text(whole, t, available=in_blocks)
