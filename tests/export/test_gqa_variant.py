"""The ``gqa`` variant: Qwen2/Qwen3 attention as one GroupQueryAttention node per layer, every output kept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from layerscope.errors import InputError

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today, and again",
         "一个人正在弹吉他。"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Tiny Qwen2 and Qwen3 with 16-wide heads (ONNX Runtime's kernel takes multiples of 16; real Qwen heads
    are 64 or 128 wide), 4 query heads sharing 2 key/value heads, 3 layers."""
    import tiny_models
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source

    root = tmp_path_factory.mktemp("gqa")
    saved = {k: getattr(tiny_models, k) for k in ("HIDDEN", "HEAD_DIM", "LAYERS")}
    tiny_models.HIDDEN, tiny_models.HEAD_DIM, tiny_models.LAYERS = 64, 16, 3
    try:
        for family in ("qwen2", "qwen3"):
            model = tiny_models.build_tiny_model(family, root / f"{family}-src", seed=1)
            export_model(resolve_source(str(model)), root / family, pooled=["mean", "last"])
    finally:
        for k, v in saved.items():
            setattr(tiny_models, k, v)
    return root


def _run(export_dir, file, texts):
    from layerscope.engines.ort_session import make_session
    from layerscope.model.handle import ModelHandle
    from layerscope.model.tokenize import Encoder

    session = make_session(export_dir / file, "CPUExecutionProvider")
    batch = Encoder(ModelHandle.resolve(export_dir).tokenizer(), [i.name for i in session.get_inputs()], 64)(texts)
    names = [o.name for o in session.get_outputs()]
    feed = {i.name: batch.inputs[i.name] for i in session.get_inputs()}
    return dict(zip(names, session.run(names, feed))), batch.mask.astype(bool)


def _min_cos(a, b):
    a = a.reshape(-1, a.shape[-1]).astype(np.float64)
    b = b.reshape(-1, b.shape[-1]).astype(np.float64)
    return float(((a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))).min())


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_gqa_variant_fuses_every_layer_and_keeps_every_output(exports, family):
    """Catches: a layer left unfused, repeat_kv copies or the eager softmax left in the graph, an output lost,
    wrong rotary tables or q/k norms (hidden states drift from layer 1 on), and padded rows leaking into
    real ones (a text alone must equal the same text in a right-padded batch)."""
    from layerscope.export.variants import make_variant
    from layerscope.model.manifest import read_manifest

    export_dir = exports / family
    entry = make_variant(export_dir, "gqa")
    manifest = read_manifest(export_dir)
    graph = onnx.load(str(export_dir / entry["file"]), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("GroupQueryAttention") == manifest.num_layers == entry["details"]["fused_attention_nodes"]
    assert "Softmax" not in ops
    assert not [n.name for n in graph.node if "/self_attn/" in n.name and n.op_type in ("Expand", "Softmax")]
    norms = [n for n in graph.node if "/q_norm/" in n.name or "/k_norm/" in n.name]
    assert bool(norms) == (family == "qwen3")  # Qwen3's per-head norms stay: the CPU kernel has none

    ref, mask = _run(export_dir, "model.onnx", TEXTS)
    got, _ = _run(export_dir, entry["file"], TEXTS)
    assert list(got) == list(ref)
    for name, want in ref.items():
        have = got[name]
        if want.ndim == 3 and want.shape[:2] == mask.shape:
            want, have = want[mask], have[mask]
        assert np.isfinite(have).all(), name
        assert _min_cos(want, have) > 0.99999, name
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    alone, alone_mask = _run(export_dir, entry["file"], TEXTS[:1])
    n = int(alone_mask.sum())
    for name in ("hidden_states.1", f"hidden_states.{manifest.num_layers}"):
        np.testing.assert_allclose(alone[name][0, :n], got[name][0, :n], rtol=1e-5, atol=1e-5)
    assert entry["precision"] == "fp32" and entry["parity"]["outputs"]


def test_gqa_is_refused_in_one_line_where_the_kernel_cannot_run(tiny_model, tmp_path):
    """An encoder, and a decoder with 8-wide heads (the kernel wants multiples of 16): refused before any work,
    nothing written."""
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source
    from layerscope.export.variants import make_variant

    for family, match in (("bert", "rotary decoders"), ("qwen2", "multiple of 16")):
        export_model(resolve_source(str(tiny_model(family))), tmp_path / family)
        with pytest.raises(InputError, match=match):
            make_variant(tmp_path / family, "gqa")
        assert not (tmp_path / family / "model.gqa.onnx").exists()


def test_auto_picks_the_gqa_variant_only_when_its_recorded_accuracy_meets_the_bar(exports, monkeypatch):
    """Catches: auto picking a variant whose accuracy was never recorded, or one below --min-cosine."""
    import json
    import shutil

    from layerscope.engines.auto import pick_engine
    from layerscope.model.handle import ModelHandle

    src = exports / "qwen2"
    work = src.parent / "qwen2-auto"
    shutil.copytree(src, work, dirs_exist_ok=True)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(work.parent / "home"))  # no bench speed order from this machine
    manifest = json.loads((work / "manifest.json").read_text())
    if "gqa" not in manifest.get("variants", {}):
        from layerscope.export.variants import make_variant

        make_variant(work, "gqa")
        manifest = json.loads((work / "manifest.json").read_text())
    for kind in list(manifest["variants"]):
        if kind not in ("gqa",):
            del manifest["variants"][kind]  # only fp32 and gqa recorded
    manifest.pop("cpu_precisions", None)
    (work / "manifest.json").write_text(json.dumps(manifest))
    engine = pick_engine(ModelHandle.resolve(work), min_cosine=0.9999)
    assert engine.variant == "gqa", engine.info.notes
    worst = min(o["min_cos"] for o in manifest["variants"]["gqa"]["parity"]["outputs"].values())
    engine = pick_engine(ModelHandle.resolve(work), min_cosine=min(1.0, worst + 1e-9))
    assert engine.variant != "gqa"
    assert any("gqa" in note and "<" in note for note in engine.info.notes), engine.info.notes


def test_gqa_reads_the_anatomy_derived_for_an_export_made_before_it(exports, tmp_path):
    """Catches: the fused-attention rewrite reading anything but the anatomy (an export made before anatomies
    were recorded derives one on load, the variant is made from it and says so)."""
    import json
    import shutil

    from layerscope.export.variants import make_variant

    old = tmp_path / "old"
    shutil.copytree(exports / "qwen3", old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["anatomy"]
    manifest["format_version"] = 1
    manifest.get("variants", {}).pop("gqa", None)
    (old / "manifest.json").write_text(json.dumps(manifest))
    (old / "model.gqa.onnx").unlink(missing_ok=True)
    entry = make_variant(old, "gqa")
    assert entry["details"]["fused_attention_nodes"] == 3 and entry["details"]["qk_norm"].startswith("per_head")
    assert "derived when its export was opened" in entry["details"]["anatomy"]
    ref, mask = _run(old, "model.onnx", TEXTS)
    got, _ = _run(old, entry["file"], TEXTS)
    assert _min_cos(ref["hidden_states.3"][mask], got["hidden_states.3"][mask]) > 0.99999
