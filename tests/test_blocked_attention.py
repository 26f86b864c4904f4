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
from hang_guard import HANG_S  # noqa: E402

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


def test_pick_blocks_says_from_which_width_blocks_run():
    from layerscope.engines.torch import SLICE_FROM

    assert pick_blocks("blocked", None) == 0 and pick_blocks("blocked", 512) == 0  # every batch
    assert pick_blocks(None, 2048) == pick_blocks("auto", SLICE_FROM + 1) == SLICE_FROM  # batches past it
    for asked, max_seq in ((None, SLICE_FROM), (None, None), ("auto", 512), ("whole", 32768)):
        assert pick_blocks(asked, max_seq) is None, (asked, max_seq)  # none
    with pytest.raises(InputError, match="attention='sliced'"):
        pick_blocks("sliced", 2048)


def test_auto_runs_the_whole_graph_until_a_batch_passes_slice_from(qwen3, bert_export, monkeypatch):
    """Under auto, where the run's texts may pass SLICE_FROM (here lowered to 64 so the tiny model's long text
    passes it), the engine opens the source graph and moves onto the one in blocks before the first batch
    wider than 64 tokens, the source graph's session released first; its vectors are the whole graph's."""
    import weakref

    from layerscope.engines import ort as ort_module

    monkeypatch.setattr("layerscope.engines.torch.SLICE_FROM", BLOCK_ROWS)
    whole = create_engine("ort", qwen3, attention="whole")
    assert create_engine("ort", qwen3, max_seq=BLOCK_ROWS).blocks_graph is None  # no text can pass it
    eng = create_engine("ort", qwen3, max_seq=4096)
    assert (eng.attention, eng.blocks_above, eng.attention_rows) == ("whole", BLOCK_ROWS, BLOCK_ROWS)
    assert eng.graph_path == qwen3 / "model.onnx" and (qwen3 / "model.blocked.onnx").is_file()  # checked, not open
    assert not any("blocks" in n for n in eng.info.notes), eng.info.notes
    layers = whole.layer_names
    short, long_batch = whole.encoder()(TEXTS[:1] + TEXTS[2:]), whole.encoder()([LONG])
    assert short.input_ids.shape[1] <= BLOCK_ROWS < long_batch.input_ids.shape[1]

    def same(batch):
        for layer, w, g in zip(layers, whole.run_tokens(batch, layers), eng.run_tokens(batch, layers)):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=0, err_msg=f"layer {layer}")

    same(short)
    assert eng.attention == "whole" and eng.graph_path == qwen3 / "model.onnx"
    alive = weakref.WeakSet([eng.session])
    real = ort_module.make_session

    def counted(*args, **kwargs):  # the source graph's session is gone before the next one is made
        assert len(alive) == 0, "two sessions held at once"
        made = real(*args, **kwargs)
        alive.add(made)
        return made

    monkeypatch.setattr(ort_module, "make_session", counted)
    old_options = eng.session.get_session_options()
    threads = old_options.intra_op_num_threads
    same(long_batch)
    assert (eng.attention, eng.blocks_above) == ("blocked", 0) and eng.graph_path == qwen3 / "model.blocked.onnx"
    assert eng.session.get_session_options().intra_op_num_threads == threads
    assert eng.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert "Loop" in _main_graph_ops(eng.graph_path)
    note = [n for n in eng.info.notes if "blocks" in n]
    assert len(note) == 1 and note[0].startswith(f"attention in blocks of {BLOCK_ROWS} query rows") \
        and note[0].endswith(f"from the first batch past {BLOCK_ROWS:,} tokens on"), eng.info.notes
    same(short)  # it stays in blocks
    assert eng.graph_path == qwen3 / "model.blocked.onnx" and len(alive) == 1
    monkeypatch.setattr(ort_module, "make_session", real)
    encoder = create_engine("ort", bert_export, max_seq=4096)  # an encoder attends both ways: whole, said
    assert encoder.attention == "whole" and encoder.attention_rows is None and encoder.blocks_graph is None
    assert any(n.startswith("attention computed whole") for n in encoder.info.notes), encoder.info.notes
    with pytest.raises(InputError, match="attention=blocked: .* cannot run its attention in blocks"):
        create_engine("ort", bert_export, attention="blocked")


def test_deciding_on_blocks_imports_neither_transformers_nor_torch(qwen3):
    """The ort engine that runs blocks (asked, or under auto past SLICE_FROM) and the memory plan read the model's
    kind from its manifest: deriving its family again would import transformers and torch, some 400 MiB resident
    for the rest of the run, in a process that otherwise needs neither."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\n"
            "from layerscope.engines.base import create_engine\n"
            "from layerscope.engines.memory import shape_planned\n"
            "from layerscope.engines.registry import resolve_engine\n"
            "from layerscope.model.handle import ModelHandle\n"
            f"h = ModelHandle.resolve({str(qwen3)!r})\n"
            "for kw in ({'attention': 'blocked'}, {'max_seq': 4096}):\n"
            "    eng = create_engine('ort', h, **kw)\n"
            "    assert eng.attention_rows, kw\n"
            "assert shape_planned(h, resolve_engine('ort'), depth=None, tokens=False, max_seq=4096).attention_rows\n"
            "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_ov_in_flight_hands_back_its_batches_before_it_moves_to_blocks(qwen3, monkeypatch):
    """OpenVINO with two batches in flight: the batches in flight when a long one comes are handed back before
    the graph it leaves is released, so no compiled model is ever held beside another, and every batch's vectors
    are the whole graph's, in order."""
    pytest.importorskip("openvino")
    import weakref

    from layerscope.engines import ov as ov_module

    monkeypatch.setattr("layerscope.engines.torch.SLICE_FROM", BLOCK_ROWS)
    whole = create_engine("ov", qwen3, attention="whole", requests=1)
    eng = create_engine("ov", qwen3, max_seq=4096, requests=2)
    assert eng.requests == 2 and eng.attention == "whole" and eng.blocks_above == BLOCK_ROWS
    alive = weakref.WeakSet([eng.session])
    real = ov_module.OvSession

    class Counted(real):
        def __init__(self, *args, **kwargs):
            assert len(alive) == 0, "two compiled models held at once"
            super().__init__(*args, **kwargs)
            alive.add(self)

    monkeypatch.setattr(ov_module, "OvSession", Counted)
    enc = whole.encoder()
    batches = [enc(["a cat sat on the mat"]), enc(["hi", "the dog runs"]), enc([LONG]), enc(["Water boils."])]
    got = list(eng.run_stream(batches, ["0", "2"], ["mean"]))
    assert [b is c for (b, _), c in zip(got, batches)] == [True] * 4
    for (batch, pooled) in got:
        np.testing.assert_allclose(pooled["mean"], whole.run(batch, ["0", "2"], ["mean"])["mean"], atol=1e-5, rtol=0)
    assert eng.attention == "blocked" and len(alive) == 1
    assert any(n.endswith(f"from the first batch past {BLOCK_ROWS:,} tokens on") for n in eng.info.notes)


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


def _opened(monkeypatch) -> list:
    """The graph files the ort engines open sessions on from now on (early exit's and the blocks' checks aside)."""
    from layerscope.engines import ort as ort_module

    opened: list = []
    real = ort_module.make_session

    def spy(model, *a, **k):
        if not isinstance(model, bytes):  # the providers' one-node probe is handed over in memory
            opened.append(model.name)
        return real(model, *a, **k)

    monkeypatch.setattr(ort_module, "make_session", spy)
    return opened


def test_a_corpus_of_short_texts_never_opens_the_graph_in_blocks(qwen3, tmp_path, monkeypatch):
    """The model's limit (128) passes SLICE_FROM (lowered to 64): a corpus whose texts all stay within 64 tokens
    runs the whole graph and its store says nothing of blocks; one with a longer text moves to blocks at it,
    says so, and stores the whole graph's vectors."""
    from layerscope.extraction.pipeline import extract
    from layerscope.store.store import LayerStore

    monkeypatch.setattr("layerscope.engines.torch.SLICE_FROM", BLOCK_ROWS)
    whole = extract(qwen3, TEXTS, tmp_path / "whole", engine="ort", layers="all", poolings=["mean"],
                    engine_options={"attention": "whole"})
    opened = _opened(monkeypatch)
    short = [t for t in TEXTS if t != LONG]
    rep = extract(qwen3, short, tmp_path / "short", engine="ort", layers="all", poolings=["mean"])
    assert opened and not any(".blocked." in name for name in opened), opened
    assert not any("blocks" in n for n in rep.engine["notes"]), rep.engine["notes"]
    assert not any("blocks" in n for n in LayerStore.open(tmp_path / "short").engine_info["notes"])
    opened.clear()
    rep = extract(qwen3, TEXTS, tmp_path / "mixed", engine="ort", layers="all", poolings=["mean"])
    graphs = [name for name in opened if name.startswith("model.")]  # a provider's probe graph aside
    assert [".blocked." in name for name in graphs] == [False, True], opened
    recorded = LayerStore.open(tmp_path / "mixed").engine_info["notes"]
    for notes in (rep.engine["notes"], recorded):
        assert any(n.endswith(f"from the first batch past {BLOCK_ROWS:,} tokens on") for n in notes), notes
    mixed, ref = LayerStore.open(tmp_path / "mixed"), LayerStore.open(tmp_path / "whole")
    assert whole.n == mixed.n
    for layer in ["0", "1", "2"]:
        np.testing.assert_allclose(mixed["mean", layer], ref["mean", layer], atol=1e-5, rtol=0, err_msg=layer)


def test_a_sharded_store_says_blocks_ran_where_a_later_range_moved_to_them(qwen3, tmp_path, monkeypatch):
    """Range 0 holds short texts only, range 1 a long one: the engine moves to blocks in range 1, and the
    finished store's engine record says so (not the first range's record alone)."""
    from layerscope.extraction.request import ExtractionRequest
    from layerscope.extraction.shard_extract import extract_shard
    from layerscope.store.store import LayerStore
    from layerscope.store.store_ranges import GRANULE

    monkeypatch.setattr("layerscope.engines.torch.SLICE_FROM", BLOCK_ROWS)
    monkeypatch.setenv("LAYERSCOPE_RANGE_ROWS", str(GRANULE))
    texts = [f"text number {i} is short" for i in range(GRANULE)] + [LONG, "hi"]
    req = ExtractionRequest.of(qwen3, texts, tmp_path / "s", engine="ort", layers="all", poolings=["mean"])
    rep = extract_shard(req, 0, 1)
    assert rep.complete and rep.ranges.computed == 2
    notes = LayerStore.open(tmp_path / "s").engine_info["notes"]
    assert any(n.endswith(f"from the first batch past {BLOCK_ROWS:,} tokens on") for n in notes), notes
    assert any(n.endswith(f"from the first batch past {BLOCK_ROWS:,} tokens on") for n in rep.engine["notes"])


def test_a_batch_shorter_than_a_block_is_not_padded_to_one(qwen3):
    """Short texts in the graph in blocks: a batch narrower than a block runs as one block of its own width, so no
    node makes a tensor larger than the whole graph's largest (padding its queries to 64 rows did: several
    ``[B, heads, 64, head_dim]`` tensors per layer), and its vectors are the whole graph's."""
    whole = create_engine("ort", qwen3, attention="whole")
    blocked = create_engine("ort", qwen3, attention="blocked")
    short = whole.encoder()(TEXTS[:1] + TEXTS[2:] + ["the cat", "a dog ran far away from home today"] * 8)
    assert short.input_ids.shape[1] < BLOCK_ROWS // 2
    assert _largest_node_output(blocked, short) <= _largest_node_output(whole, short)
    layers = whole.layer_names
    for layer, w, g in zip(layers, whole.run_tokens(short, layers), blocked.run_tokens(short, layers)):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0, err_msg=f"layer {layer}")
