"""A pooled-only graph pools each layer as it is made (engines/layer_pooling.py): no node stacks the layers' token
states, ONNX Runtime runs a layer's pooling before the next block's last nodes are reached, and the pooled vectors
equal the full graph's."""

from __future__ import annotations

import json

import numpy as np
import onnx

from layerscope.engines.base import create_engine
from layerscope.engines.layer_pooling import pooling_stack

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake"]


def _order(path, batch) -> list[str]:
    """The names of the nodes ONNX Runtime ran for ``batch``, in the order it ran them (from its profile)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.intra_op_num_threads = 1
    opts.profile_file_prefix = str(path.parent / "order")
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    session.run(None, {k: v for k, v in batch.inputs.items() if k in inputs})
    events = json.loads(open(session.end_profiling()).read())
    ran = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return [e["name"][: -len("_kernel_time")] for e in sorted(ran, key=lambda e: e["ts"])]


def test_each_layer_is_pooled_as_it_is_made(bert_export):
    full = create_engine("ort", bert_export)
    eng = create_engine("ort", bert_export, depth=1, pooled_only=True)
    assert eng.pooled_only and eng.graph_path.name == "model.upto-1.pooled.onnx"
    stacked = onnx.load(str(bert_export / "model.onnx"), load_external_data=False).graph
    derived = onnx.load(str(eng.graph_path), load_external_data=False).graph
    assert pooling_stack(stacked) is not None and pooling_stack(derived) is None  # no [layers, batch, T, hidden] stack
    batch = full.encoder()(TEXTS)
    names = [n for n in full.layer_names if n == "raw" or int(n) <= 1]
    want = full.run(batch, names, list(full.manifest.pooled_modes))
    got = eng.run(batch, names, list(full.manifest.pooled_modes))
    for mode in want:
        np.testing.assert_array_equal(got[mode], want[mode], err_msg=mode)
    # layer 0 (the embeddings' output) is pooled before the next block (tiny BERT: /encoder/layer.0/...) ends: its
    # token states need not wait for the other layers (a stack holds them all until the last block is done)
    order = _order(eng.graph_path, batch)
    at = eng.pooled_layers.index("0")
    pooled = [i for i, name in enumerate(order) if name.endswith(f"/layer{at}")]
    next_block = [i for i, name in enumerate(order) if "/encoder/layer.0/" in name]
    assert pooled and next_block
    assert max(pooled) < max(next_block), (max(pooled), max(next_block))


def test_a_run_of_every_layer_derives_no_graph(bert_export):
    """Catches: the first run of every layer building, checking and keeping a pooled-only copy of the whole model
    (the weights copied beside the export where it has no external data) for nothing it could prune."""
    before = {p.name for p in bert_export.iterdir()}
    eng = create_engine("ort", bert_export, pooled_only=True)
    assert eng.graph_path == (bert_export / "model.onnx").resolve() or eng.graph_path == bert_export / "model.onnx"
    assert not eng.pooled_only and eng.depth is None
    assert {p.name for p in bert_export.iterdir()} == before
    full = create_engine("ort", bert_export)
    batch = full.encoder()(TEXTS)
    want = full.run(batch, full.layer_names, list(full.manifest.pooled_modes))
    got = eng.run(batch, eng.layer_names, list(eng.manifest.pooled_modes))
    for mode in want:
        np.testing.assert_array_equal(got[mode], want[mode], err_msg=mode)
