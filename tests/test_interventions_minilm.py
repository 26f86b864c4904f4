"""``run patch`` and ``run steer`` on the real all-MiniLM-L6-v2 (resume graphs on ONNX Runtime) equal the plain
Hugging Face model with forward hooks written in tests/intervene_reference.py, at a first, a middle and the last
layer (the tiny models' tests take every layer)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from intervene_reference import Reference, add_everywhere, cosine, mean_pool, replace_at
from layerscope.analyses.base import RunRequest, run_analysis

pytestmark = pytest.mark.slow
LAYERS = (1, 4, 6)

# BERT's word pieces: each swapped word is one token, so positions align
PAIRS = [{"clean": "A man is playing a guitar.", "corrupted": "A man is playing a piano.",
          "other": "Someone plays the guitar."},
         {"clean": "The cat sleeps on the sofa.", "corrupted": "The dog sleeps on the sofa.",
          "other": "A cat is asleep on a couch."}]
STEER = [{"positive": "The film was a delight.", "negative": "The film was a mess."},
         {"positive": "I loved the food here.", "negative": "I hated the food here."},
         {"positive": "A wonderful, happy day.", "negative": "A terrible, sad day."},
         {"positive": "The staff were kind and helpful.", "negative": "The staff were rude and useless."}]


@pytest.fixture(scope="module")
def minilm(minilm_export, tmp_path_factory):
    """A copy of the MiniLM export of this module's own (its resume graphs are made in it), and the checkpoint."""
    from layerscope.model.handle import ModelHandle

    copy = tmp_path_factory.mktemp("minilm-resume") / "export"
    shutil.copytree(minilm_export, copy, symlinks=True)
    return copy, ModelHandle.resolve(str(copy)).source().path_or_id


def _reference(checkpoint):
    """MiniLM as plain transformers loads it (a BertModel: no head), hooks on its blocks and last block."""
    from transformers import AutoModel

    ref = Reference.__new__(Reference)
    ref.net = AutoModel.from_pretrained(str(checkpoint), attn_implementation="eager").eval()
    ref.blocks = ref.net.get_submodule("encoder.layer")
    ref.last = ref.net.get_submodule("encoder.layer.5")
    ref.family, ref.num_layers = "bert", 6
    return ref


def _tokens(tok, text):
    return {k: np.asarray(v)[None] for k, v in tok(text).items()}


def test_patch_on_minilm_equals_hooks(minilm, tmp_path):
    from transformers import AutoTokenizer

    export, checkpoint = minilm
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = run_analysis("patch", RunRequest(models=(str(export),), engine="ort", data=str(data), out=tmp_path / "o",
                                           layers=",".join(map(str, LAYERS))))
    fig = next(iter(out.results["per_model"].values()))
    ref, tok = _reference(checkpoint), AutoTokenizer.from_pretrained(str(checkpoint))
    num = np.zeros((len(LAYERS), 9))
    den = 0.0
    for pair in PAIRS:
        clean, corr = _tokens(tok, pair["clean"]), _tokens(tok, pair["corrupted"])
        assert clean["input_ids"].shape[1] == 9
        other = mean_pool(ref.run(_tokens(tok, pair["other"]))[0][-1][0])
        states, _ = ref.run(clean)
        base = cosine(mean_pool(ref.run(corr)[0][-1][0]), other)
        den += cosine(mean_pool(states[-1][0]), other) - base
        for li, layer in enumerate(LAYERS):
            for t in range(9):
                got = ref.run(corr, layer, replace_at([t], states[layer][0]))[0][-1][0]
                num[li, t] += cosine(mean_pool(got), other) - base
    np.testing.assert_allclose(np.array(fig["grids"]["effect"], dtype=float), num / den, atol=2e-4)
    assert fig["summary"]["metric_reads"].endswith("the pair's other text's")
    assert fig["summary"]["suffix_runs"] == 2 * 2 and fig["summary"]["naive_runs"] == 2 * 3 * 9


def test_steer_on_minilm_equals_hooks(minilm, tmp_path):
    from transformers import AutoTokenizer

    export, checkpoint = minilm
    data = tmp_path / "steer.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in STEER))
    out = run_analysis("steer", RunRequest(models=(str(export),), engine="ort", data=str(data), out=tmp_path / "o",
                                           layers=",".join(map(str, LAYERS)), options={"scales": "3"}))
    fig = next(iter(out.results["per_model"].values()))
    ref, tok = _reference(checkpoint), AutoTokenizer.from_pretrained(str(checkpoint))
    held = set(fig["held_out"])
    train = [p for i, p in enumerate(STEER, 1) if i not in held]
    test = [p for i, p in enumerate(STEER, 1) if i in held]
    pos = np.stack([[mean_pool(h[0]) for h in ref.run(_tokens(tok, p["positive"]))[0]] for p in train], axis=1)
    neg = np.stack([[mean_pool(h[0]) for h in ref.run(_tokens(tok, p["negative"]))[0]] for p in train], axis=1)
    vectors = (pos - neg).mean(axis=1)
    gap = pos[-1].mean(axis=0) - neg[-1].mean(axis=0)
    unit, size = gap / np.linalg.norm(gap), np.linalg.norm(gap)
    rows = {(r["direction"], r["layer"]): r for r in fig["tables"]["steer_cells"]}
    for layer in LAYERS:
        moved = []
        for p in test:
            inputs = _tokens(tok, p["negative"])
            base = mean_pool(ref.run(inputs)[0][-1][0])
            got = mean_pool(ref.run(inputs, layer, add_everywhere(3.0 * vectors[layer]))[0][-1][0])
            moved.append((got - base) @ unit / size)
        assert rows[("steer", str(layer))]["projection"] == pytest.approx(np.mean(moved), abs=5e-4), layer
