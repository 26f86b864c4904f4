"""The ``lens`` analysis's figures (the smoke run in tests/analyses/test_lens_saliency_runs.py checks only
that it completes) against the logit lens written out by hand with the checkpoint's own MLM head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerscope.analyses.base import RunRequest, run_analysis

TEXTS = ["the cat sat on the mat", "water boils at sea level", "the river flows slowly through the old town"]


@pytest.mark.parametrize("engine,head_bytes", [("torch", None), ("ort", None), ("ort", 1), ("ov", None)])
def test_lens_table_equals_a_hand_computed_logit_lens(tiny_model, tmp_path, engine, head_bytes, monkeypatch):
    """Per layer: mean rank of the input token among the head's logits, how often it is the top-1, how
    often the top-1 equals the last layer's, over real non-special positions.

    Catches: special-token targets counted (``special = set()`` in analyses/lens.py) and the layer
    rows of the table shifted against the layers decoded (``full.rank[idx]`` read with ``idx[::-1]``), and
    OpenVINO (which ``auto`` picks at fp32) failing the lens. On the ONNX engines the head graph decodes the
    engine's hidden states, with a 1-byte budget one position per run (the positions scattered back to the
    wrong place would change every figure)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    if head_bytes:
        monkeypatch.setattr("layerscope.decoding.lens_onnx.HEAD_BYTES", head_bytes)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))

    model_dir = tiny_model("bert")
    data = tmp_path / "t.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    if engine == "ov":
        pytest.importorskip("openvino")
    ctx = RunRequest(models=[str(model_dir)], engine=engine, out=tmp_path / "out", poolings=["mean"], cache=False,
                     data=str(data), layers="all", options={"top_k": 3, "show": 0, "batch": 2})
    _, results = run_analysis("lens", ctx)
    table = next(iter(results["per_model"].values()))["tables"]["lens_by_layer"]

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    special = set(tok.all_special_ids)
    ranks = {layer: [] for layer in range(3)}
    top1 = {layer: [] for layer in range(3)}
    for text in TEXTS:
        enc = tok(text, return_tensors="pt")
        with torch.no_grad():
            hidden = net(**enc, output_hidden_states=True).hidden_states
            logits = [net.cls(h)[0].numpy().astype(np.float64) for h in hidden]
        ids = enc["input_ids"][0].tolist()
        for pos, target in enumerate(ids):
            if target in special:
                continue
            for layer in range(3):
                row = logits[layer][pos]
                ranks[layer].append(1 + int((row > row[target]).sum()))
                top1[layer].append(int(row.argmax()))
    assert [r["layer"] for r in table] == ["0", "1", "2"]
    for layer, r in enumerate(table):
        assert r["positions"] == len(ranks[layer])
        assert r["mean_rank"] == pytest.approx(np.mean(ranks[layer]), abs=1e-9)
        assert r["top1_is_target"] == pytest.approx(np.mean(np.array(ranks[layer]) == 1), abs=1e-9)
        agree = np.mean(np.array(top1[layer]) == np.array(top1[2]))
        assert r["top1_agrees_with_last"] == pytest.approx(agree, abs=1e-9)
    # not vacuous: the layers differ in what they decode
    assert len({r["mean_rank"] for r in table}) == 3
