"""The ``gqa`` variant on the zoo's tiny Mistral (sliding window of 4 tokens), OLMo-2 (q/k norms over all heads)
and Granite (its own attention scale), with 16-wide heads: every layer fused, every output kept, parity with
the fp32 graph on texts longer than the window."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today, and again",
         "一个人正在弹吉他。"]
# what each family's fused node must say besides the heads (the kernel's defaults are the other families')
ATTRIBUTES = {"mistral": {"local_window_size": 4}, "olmo2": {}, "granite": {"scale": pytest.approx(0.2)}}


@pytest.fixture(scope="module", params=sorted(ATTRIBUTES))
def family_export(request, tmp_path_factory):
    import tiny_zoo
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    family = request.param
    root = tmp_path_factory.mktemp(f"gqa-{family}")
    saved = dict(tiny_zoo.SHAPES[family])
    tiny_zoo.SHAPES[family].update(hidden_size=64, head_dim=16, num_hidden_layers=3)  # the kernel: 16-wide heads
    try:
        ckpt = tiny_zoo.build_zoo_model(family, root / "src", seed=1)
    finally:
        tiny_zoo.SHAPES[family] = saved
    export_model(resolve_source(str(ckpt)), root / "onnx", pooled=["mean", "last"])
    return family, root / "onnx"


def _run(export_dir, file):
    from layerscope.engines.ort import make_session
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder

    session = make_session(export_dir / file, "CPUExecutionProvider")
    batch = Encoder(ModelHandle.resolve(export_dir).tokenizer(), [i.name for i in session.get_inputs()], 64)(TEXTS)
    names = [o.name for o in session.get_outputs()]
    return batch, dict(zip(names, session.run(names, {i.name: batch.inputs[i.name] for i in session.get_inputs()})))


def test_gqa_variant_fuses_every_layer_and_matches_fp32(family_export):
    """Catches: the family refused, a layer left unfused, Mistral's window off by one or missing (positions
    past the 4th drift), OLMo-2's q/k norms skipped (the kernel reading the projections), Granite's scale left at
    1/sqrt(head_dim), an output lost."""
    from onnx import helper

    from layerscope.export.variants import make_variant

    family, export_dir = family_export
    entry = make_variant(export_dir, "gqa")
    graph = onnx.load(str(export_dir / entry["file"]), load_external_data=False).graph
    fused = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(fused) == 3 == entry["details"]["fused_attention_nodes"]
    assert "Softmax" not in [n.op_type for n in graph.node]
    for node in fused:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        for name, want in ATTRIBUTES[family].items():
            assert attrs.get(name) == want, (name, attrs)
        assert "scale" in attrs or family != "granite"
        assert "local_window_size" in attrs or family != "mistral"
    batch, ref = _run(export_dir, "model.onnx")
    _, got = _run(export_dir, entry["file"])
    mask = batch.mask.astype(bool)
    assert mask.sum(axis=1).max() > 4  # longer than Mistral's window
    assert list(got) == list(ref)
    for name, want in ref.items():
        have = got[name]
        if want.ndim == 3 and want.shape[:2] == mask.shape:
            want, have = want[mask], have[mask]
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())), err_msg=name)
