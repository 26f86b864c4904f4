"""DeBERTa-v2 on OpenVINO: the export holds no ``If`` (OpenVINO's CPU plug-in refuses one whose branches differ
in rank) and OpenVINO's hidden states equal ONNX Runtime's."""

from __future__ import annotations

import numpy as np
import onnx

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today"]


def test_deberta_v2_export_compiles_on_openvino_and_matches_onnx_runtime(tiny_model, tmp_path):
    """Catches: DeBERTa's scripted relative-position branch exported as an If (compile fails), and a traced
    replacement that takes the wrong branch (the hidden states would differ from ONNX Runtime's, which the
    export itself holds to PyTorch)."""
    from layerscope.engines.ort import make_session
    from layerscope.engines.ov import OvSession
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder

    out = tmp_path / "exp"
    export_model(resolve_source(str(tiny_model("deberta-v2"))), out, pooled=["mean"])
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    assert "If" not in {n.op_type for n in graph.node}
    session = make_session(out / "model.onnx", "CPUExecutionProvider")
    batch = Encoder(ModelHandle.resolve(out).tokenizer(), [i.name for i in session.get_inputs()], 64)(TEXTS)
    feed = {i.name: batch.inputs[i.name] for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs() if o.name.startswith("hidden_states.")]
    want = dict(zip(names, session.run(names, feed)))
    got = dict(zip(names, OvSession(out / "model.onnx", "fp32").run(names, feed)))  # compiles at f32
    mask = batch.mask.astype(bool)
    for name in names:
        np.testing.assert_allclose(got[name][mask], want[name][mask], atol=1e-4, err_msg=name)
