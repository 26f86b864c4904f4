"""The OpenVINO engine and its recorded precisions stay within tolerance of plain Hugging Face; auto's choice."""

from __future__ import annotations

import json
import numpy as np
import pytest

pytest.importorskip("openvino")

TEXTS = ["a dog plays in the snow", "Hi", "the weather is sunny and warm today, so we walk to the lake",
         "she bought apples", "two dogs near the lake", "embedding models turn sentences into vectors"]


@pytest.fixture(scope="module")
def export_dir(bert_export):
    return bert_export


def _manifest(export_dir):
    return json.loads((export_dir / "manifest.json").read_text())


def _hf_pooled(model_dir, texts, layers):
    """Plain Hugging Face: every hidden state, mean-pooled over the attention mask, fp32."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    net = AutoModel.from_pretrained(str(model_dir), use_safetensors=True).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        states = net(**enc, output_hidden_states=True).hidden_states
    m = enc["attention_mask"][..., None].float()
    return np.stack([((states[int(n)] * m).sum(1) / m.sum(1)).numpy() for n in layers])


def test_ov_fp32_outputs_keep_the_onnx_names(export_dir):
    import onnx

    from layerscope.engines.ov import OvSession

    session = OvSession(export_dir / "model.onnx", "fp32")
    want = [o.name for o in onnx.load(str(export_dir / "model.onnx")).graph.output]
    # OpenVINO gives a port every name its tensor had (raw_embeddings is also the Gather's output)
    assert sorted(o.name for o in session.get_outputs()) == sorted(want)


def test_ov_fp32_recorded_and_engine_within_tolerance_of_hf(export_dir, tiny_model):
    from layerscope.engines.base import create_engine
    from layerscope.export.variants import make_variant

    entry = make_variant(export_dir, "ov-fp32")
    recorded = _manifest(export_dir)["variants"]["ov-fp32"]
    assert recorded == json.loads(json.dumps(entry))
    assert recorded["engine"] == "ov" and recorded["file"] == "model.onnx" and recorded["compiled_precision"] == "f32"
    tol = recorded["tolerance"]
    assert set(recorded["parity"]["outputs"]) == set(_manifest(export_dir)["outputs"])
    for name, stats in recorded["parity"]["outputs"].items():
        assert stats["max_abs"] <= tol["max_abs"] and stats["min_cos"] >= tol["min_cos"], name

    eng = create_engine("ov", str(export_dir))
    assert eng.info.provider.startswith("openvino") and eng.info.precision == "fp32"
    assert not any("not recorded" in n for n in eng.info.notes)
    layers = eng.layer_names[1:]  # 0..L
    batch = eng.encoder()(TEXTS)
    got = eng.run(batch, layers, ["mean"])["mean"]
    ref = _hf_pooled(tiny_model("bert"), TEXTS, layers)
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max()) <= tol["max_abs"]
    tokens = eng.run_tokens(batch, ["2"])[0]
    assert tokens.shape[:2] == batch.mask.shape


def test_ov_bf16_only_where_the_cpu_has_it(export_dir, tiny_model, monkeypatch):
    from layerscope.engines import ov
    from layerscope.engines.base import create_engine
    from layerscope.errors import EngineUnavailableError
    from layerscope.export.variants import make_variant

    if "BF16" in ov.cpu_capabilities():
        entry = make_variant(export_dir, "ov-bf16")
        assert entry["compiled_precision"] == "bf16"
        for name, stats in entry["parity"]["outputs"].items():
            assert stats["min_cos"] >= entry["tolerance"]["min_cos"], name
        eng = create_engine("ov", str(export_dir), variant="bf16")
        layers = eng.layer_names[1:]
        got = eng.run(eng.encoder()(TEXTS), layers, ["mean"])["mean"]
        ref = _hf_pooled(tiny_model("bert"), TEXTS, layers)
        cos = (got * ref).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(ref, axis=-1)
        assert cos.min() >= entry["tolerance"]["min_cos"]
    # a CPU without bf16 compute: one clear error, never a silent fp32 run called bf16
    monkeypatch.setattr(ov, "cpu_capabilities", lambda: ["FP32", "INT8"])
    with pytest.raises(EngineUnavailableError, match="no bf16 compute"):
        create_engine("ov", str(export_dir), variant="bf16")
    with pytest.raises(EngineUnavailableError, match="no bf16 compute"):
        make_variant(export_dir, "ov-bf16", force=True)


def test_ov_int8_recorded_only_within_its_tolerance(export_dir):
    from layerscope.errors import ExportError
    from layerscope.export.variants import make_variant

    try:
        entry = make_variant(export_dir, "ov-int8")
    except ExportError as exc:
        assert "outside its tolerance" in str(exc)
        assert "ov-int8" not in _manifest(export_dir).get("variants", {})
        return
    assert entry["file"] == "model.int8.onnx" and entry["tolerance"]["min_cos"] == 0.99
    for name, stats in entry["parity"]["outputs"].items():
        assert stats["min_cos"] >= 0.99, name


def test_ov_names_are_not_onnx_runtime_variants(export_dir):
    from layerscope.engines.base import create_engine
    from layerscope.errors import InputError
    from layerscope.model.variants import check_kind

    with pytest.raises(InputError, match="--engine ov --variant bf16"):
        create_engine("ort", str(export_dir), variant="ov-bf16")
    with pytest.raises(InputError, match="ov-fp32"):
        check_kind("ov-fp16")
    with pytest.raises(InputError, match="runs variants fp32, bf16, int8"):
        create_engine("ov", str(export_dir), variant="fp16")


def _copy_with_variants(export_dir, dst, keep):
    import shutil

    shutil.copytree(export_dir, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["variants"] = {k: v for k, v in manifest.get("variants", {}).items() if k in keep}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    from layerscope.model.manifest import read_manifest

    return dst, read_manifest(dst)


def test_auto_picks_the_fastest_engine_that_meets_min_cosine(export_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))  # no bench speeds recorded: the declared order
    from layerscope.engines.auto import recorded_min_cosine
    from layerscope.engines.base import create_engine
    from layerscope.errors import InputError
    from layerscope.export.variants import make_variant

    make_variant(export_dir, "ov-fp32")
    make_variant(export_dir, "int8")
    export, manifest = _copy_with_variants(export_dir, tmp_path / "e", {"ov-fp32", "int8"})
    int8_cos = recorded_min_cosine(manifest, "int8")
    ov_cos = recorded_min_cosine(manifest, "ov-fp32")
    assert int8_cos == min(s.min_cos for n, s in manifest.variants["int8"].parity.outputs.items()
                           if n.startswith(("hidden_states.", "pooled.")))
    assert int8_cos < ov_cos

    def picked(**kw):
        eng = create_engine("auto", str(export), **kw)
        return eng, next(n for n in eng.info.notes if n.startswith("auto picked"))

    # int8 is ranked faster than ov fp32: a bar it meets picks it, a bar just above it does not
    eng, note = picked(min_cosine=int8_cos)
    assert (eng.name, eng.variant) == ("ort", "int8") and f"min cosine {int8_cos:.6f}" in note
    eng, note = picked(min_cosine=min(1.0, (int8_cos + ov_cos) / 2))
    assert (eng.name, eng.variant) == ("ov", None), note
    assert f"ort int8: min cosine {int8_cos:.6f} <" in note
    eng, note = picked()  # the default bar, 0.9999 (the tiny model's int8 may meet it)
    assert (eng.name, eng.variant) == (("ort", "int8") if int8_cos >= 0.9999 else ("ov", None)), note
    assert ">= 0.9999" in note
    with pytest.raises(InputError, match="use it with --engine auto"):
        create_engine("ort", str(export), min_cosine=0.99)
    with pytest.raises(InputError, match="must be in"):
        create_engine("auto", str(export), min_cosine=1.5)


def test_auto_gives_ov_fp32_the_export_parity_and_passes_over_unrecorded_precisions(export_dir, tmp_path, monkeypatch):
    # no bench speeds of this machine (a user's `layerscope bench` ranked ort first and hid ov's note)
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    from layerscope.engines.base import create_engine

    bare, _ = _copy_with_variants(export_dir, tmp_path / "bare", set())
    eng = create_engine("auto", str(bare))
    note = next(n for n in eng.info.notes if n.startswith("auto picked"))
    # ov at fp32 runs the export's own graph: it has the export's parity; the precisions never checked do not
    assert (eng.name, eng.variant) == ("ov", None), note
    assert "(the export's fp32 parity)" in note and "ov int8: accuracy not recorded" in note
    assert not any("not recorded" in n for n in eng.info.notes if not n.startswith("auto picked"))


def test_engines_table_lists_ov_and_what_auto_picks(export_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))  # no bench speeds recorded: the declared order
    from layerscope.engines.probe import probe_all
    from layerscope.export.variants import make_variant

    make_variant(export_dir, "ov-fp32")
    bare, _ = _copy_with_variants(export_dir, tmp_path / "bare", set())
    only_ov, manifest = _copy_with_variants(export_dir, tmp_path / "ov", {"ov-fp32"})
    by = {s.name: s for s in probe_all(str(bare))}
    assert by["ov"].works and "OpenVINO" in by["ov"].detail
    if by["trt"].works or by["cuda"].works:
        pytest.skip("a GPU engine starts here: auto picks it")
    assert by["auto"].detail == "picks ov here (recorded min cosine " + \
        f"{min(s.min_cos for n, s in manifest.parity.outputs.items() if n.startswith(('hidden_states.', 'pooled.'))):.6f}" + \
        "; order from the declared order (no layerscope bench of these engines on this CPU yet))"
    by = {s.name: s for s in probe_all(str(only_ov))}
    assert by["auto"].detail.startswith("picks ov here (recorded min cosine")


def test_auto_records_its_pick_so_resume_never_mixes_precisions(export_dir, tmp_path):
    from layerscope.engines.auto import recorded_min_cosine
    from layerscope.errors import StoreError
    from layerscope.export.variants import make_variant
    from layerscope.extraction.pipeline import extract
    from layerscope.store.store import LayerStore

    make_variant(export_dir, "int8")
    make_variant(export_dir, "ov-fp32")
    export, manifest = _copy_with_variants(export_dir, tmp_path / "e", {"int8", "ov-fp32"})
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    int8_cos = recorded_min_cosine(manifest, "int8")
    out = tmp_path / "store"
    extract(str(export), str(corpus), out, engine="auto", engine_options={"min_cosine": int8_cos})
    assert LayerStore.open(out).spec.variant == "int8"
    # a resume where auto would now pick fp32 (a stricter bar) is refused instead of mixing precisions
    bar = min(1.0, (int8_cos + recorded_min_cosine(manifest, "ov-fp32")) / 2)
    with pytest.raises(StoreError, match="auto picked None"):
        extract(str(export), str(corpus), out, engine="auto", resume=True, engine_options={"min_cosine": bar})
    # the same bar resumes (nothing left to do)
    extract(str(export), str(corpus), out, engine="auto", resume=True, engine_options={"min_cosine": int8_cos})
