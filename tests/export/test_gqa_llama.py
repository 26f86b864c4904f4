"""The ``gqa`` variant on Llama (the zoo's tiny Llama with 16-wide heads): every layer fused, every output
kept, parity with the fp32 graph."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today, and again",
         "一个人正在弹吉他。"]


@pytest.fixture(scope="module")
def llama_export(tmp_path_factory):
    import tiny_zoo
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("gqa-llama")
    saved = dict(tiny_zoo.SHAPES["llama"])
    tiny_zoo.SHAPES["llama"].update(hidden_size=64, head_dim=16, num_hidden_layers=3)  # the kernel: 16-wide heads
    try:
        ckpt = tiny_zoo.build_zoo_model("llama", root / "src", seed=1)
    finally:
        tiny_zoo.SHAPES["llama"] = saved
    export_model(resolve_source(str(ckpt)), root / "onnx", pooled=["mean", "last"])
    return root / "onnx"


def test_gqa_variant_fuses_every_llama_layer_and_matches_fp32(llama_export):
    """Catches: Llama refused by the gqa variant, a layer left unfused (anchors named differently from
    Qwen's, no q/k biases), wrong rotary tables (hidden states drift from layer 1 on), an output lost."""
    from layerscope.engines.ort_session import make_session
    from layerscope.export.variants import make_variant
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder

    entry = make_variant(llama_export, "gqa")
    graph = onnx.load(str(llama_export / entry["file"]), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("GroupQueryAttention") == 3 == entry["details"]["fused_attention_nodes"]
    assert "Softmax" not in ops
    results = []
    for file in ("model.onnx", entry["file"]):
        session = make_session(llama_export / file, "CPUExecutionProvider")
        batch = Encoder(ModelHandle.resolve(llama_export).tokenizer(), [i.name for i in session.get_inputs()], 64)(TEXTS)
        names = [o.name for o in session.get_outputs()]
        results.append(dict(zip(names, session.run(names, {i.name: batch.inputs[i.name] for i in session.get_inputs()}))))
    ref, got = results
    mask = batch.mask.astype(bool)
    assert list(got) == list(ref)
    for name, want in ref.items():
        have = got[name]
        if want.ndim == 3 and want.shape[:2] == mask.shape:
            want, have = want[mask], have[mask]
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())), err_msg=name)
