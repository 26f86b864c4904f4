"""Every family exports with all hidden states, raw embeddings and in-graph pooling, matching torch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from layerscope.engines.base import create_engine
from layerscope.vocab.layers import layer_names
from layerscope.model.handle import ModelHandle
from layerscope.vocab.pooling import pool
from hf_reference import check_engine, hf_reference
from tiny_models import FAMILIES

TEXTS = ["a cat sat on the mat", "hi", "the quick brown fox jumps over the lazy dog twice today",
         "一只猫坐在垫子上", ""]


@pytest.fixture(scope="module")
def exported(tiny_export):
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = tiny_export(family)  # export_model with its defaults, shared by the session
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_export_manifest_and_parity(family, exported):
    out = exported(family)
    manifest = json.loads((out / "manifest.json").read_text())
    num_layers = manifest["num_layers"]
    assert manifest["family"] == family
    assert manifest["kind"] == ("decoder" if family in ("gpt2", "qwen2", "qwen3") else "encoder")
    expected = [f"hidden_states.{i}" for i in range(num_layers + 1)] + ["raw_embeddings"]
    assert all(name in manifest["outputs"] for name in expected)
    assert manifest["pooled_layers"] == layer_names(num_layers)
    for mode in manifest["pooled_modes"]:
        assert manifest["outputs"][f"pooled.{mode}"][0] == num_layers + 2
    parity = manifest["parity"]["outputs"]
    assert set(parity) == set(manifest["outputs"])  # every output was checked
    for name, figures in parity.items():
        assert figures["max_abs"] <= 1e-4, (name, figures)
        assert figures["min_cos"] >= 0.9999, (name, figures)
    assert manifest["source"]["weights_sha256"] and len(manifest["source"]["weights_sha256"]) == 64
    for key in ("opset", "dtype", "max_length", "hidden_size", "layerscope_version", "onnx_sha256"):
        assert manifest[key]
    if family == "clip-text":
        assert "pooler_output" in manifest["outputs"] and "eos" in manifest["pooled_modes"]
    if manifest["kind"] == "decoder":
        assert manifest["final_norm_in_last_layer"] is True
        assert "position_ids" in manifest["inputs"]


@pytest.mark.parametrize("family", FAMILIES)
def test_ort_engine_matches_torch_engine_every_layer_and_pooling(family, exported):
    handle = ModelHandle.resolve(exported(family))
    ort_engine = create_engine("ort", handle)
    torch_engine = create_engine("torch", handle)
    encoder = ort_engine.encoder()
    batch = encoder(TEXTS)
    layers = list(handle.manifest.layers)
    poolings = list(handle.manifest.pooled_modes)
    got = ort_engine.run(batch, layers, poolings)  # in-graph pooling
    ref = torch_engine.run(batch, layers, poolings)  # numpy pooling over torch states
    for mode in poolings:
        assert got[mode].shape == (len(layers), len(TEXTS), handle.manifest.hidden_size)
        np.testing.assert_allclose(got[mode], ref[mode], atol=1e-4, err_msg=f"{family} {mode}")
    tokens_ort = ort_engine.run_tokens(batch, ["raw", "0", str(handle.manifest.num_layers)])
    tokens_ref = torch_engine.run_tokens(batch, ["raw", "0", str(handle.manifest.num_layers)])
    valid = batch.mask.astype(bool)
    for a, b in zip(tokens_ort, tokens_ref):
        np.testing.assert_allclose(a[valid], b[valid], atol=1e-4)


def test_in_graph_pooling_equals_numpy_pooling_of_token_states(exported):
    handle = ModelHandle.resolve(exported("bert"))
    engine = create_engine("ort", handle)
    batch = engine.encoder()(TEXTS)
    layers = list(handle.manifest.layers)
    states = engine.run_tokens(batch, layers)
    pooled = engine.run(batch, layers, ["mean", "max", "last", "mean-nobos", "cls"])
    for mode, arr in pooled.items():
        ref = np.stack([pool(s, batch.mask, mode) for s in states])
        np.testing.assert_allclose(arr, ref, atol=1e-5, err_msg=mode)


def test_raw_embeddings_are_the_word_embedding_rows(exported, tiny_model):
    from safetensors.numpy import load_file

    handle = ModelHandle.resolve(exported("bert"))
    engine = create_engine("ort", handle)
    batch = engine.encoder()(["a cat sat"])
    raw = engine.run_tokens(batch, ["raw"])[0][0]
    weights = load_file(str(tiny_model("bert") / "model.safetensors"))
    table = next(v for k, v in weights.items() if k.endswith("word_embeddings.weight"))
    np.testing.assert_allclose(raw, table[batch.input_ids[0]], atol=0)


def test_eos_pooling_reads_the_clip_eos_position(exported):
    handle = ModelHandle.resolve(exported("clip-text"))
    engine = create_engine("torch", handle)
    batch = engine.encoder()(["a cat", "a much longer sentence about cats"])
    eos_id = handle.manifest.eos_token_id
    last_layer = str(handle.manifest.num_layers)
    states = engine.run_tokens(batch, [last_layer])[0]
    pooled = engine.run(batch, [last_layer], ["eos"])["eos"][0]
    for row in range(2):
        pos = int(np.argmax(batch.input_ids[row] == eos_id))
        np.testing.assert_allclose(pooled[row], states[row, pos], atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizers_only_path_is_verified_and_identical(family, exported):
    from layerscope.model.tokenize import Encoder
    from layerscope.model.fast_tokenizer import FastTokenizer

    handle = ModelHandle.resolve(exported(family))
    info = handle.manifest.tokenizer
    assert info.fast is True, family  # every tiny tokenizer is a fast one, so the check must pass
    fast = handle.encoding_tokenizer()
    assert isinstance(fast, FastTokenizer)
    texts = TEXTS + ["word " * 300, "   "]
    for max_length in (5, handle.manifest.max_length):
        a = Encoder(fast, list(handle.manifest.inputs), max_length)(texts)
        b = Encoder(handle.tokenizer(), list(handle.manifest.inputs), max_length)(texts)
        assert a.inputs.keys() == b.inputs.keys()
        for key in a.inputs:
            np.testing.assert_array_equal(a.inputs[key], b.inputs[key], err_msg=f"{family} {key} {max_length}")
        np.testing.assert_array_equal(a.truncated, b.truncated)


def test_a_tokenizer_the_fast_path_cannot_reproduce_is_not_used(exported, tmp_path):
    import shutil

    from layerscope.model.fast_tokenizer import FastTokenizer, matches_hf

    handle = ModelHandle.resolve(exported("bert"))
    hf = handle.tokenizer()
    broken = tmp_path / "tokenizer.json"
    shutil.copy(handle.export_dir / "tokenizer.json", broken)
    fast = FastTokenizer(broken, handle.manifest.tokenizer.special_ids)
    fast.tokenizer.post_processor = None  # drops [CLS]/[SEP]: no longer what Hugging Face gives
    assert not matches_hf(fast, hf, TEXTS, (8,))


# Agreement reached on this machine (onnxruntime 1.31 CPU, torch 2.13): max |diff| <= 1.1e-6 over all
# families and layers (T5 the largest, 7e-7 for most). 2e-5 leaves an 18x margin for another CPU or BLAS.
HF_MAX_ABS = 2e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_every_token_level_output_matches_plain_hugging_face(family, exported, tiny_model):
    """Every token-level output (raw and every hidden state, not only pooled ones) against plain Hugging
    Face, masked to real tokens, through layerscope's own tokenization and ONNX Runtime engine.

    Catches: decoder position ids left at zero (``np.zeros_like(mask)`` for ``position_ids`` in
    model/tokenize.py ``Encoder``): the export, its own parity check and the torch engine all get the
    same wrong positions, so every other test here sees them agree with one another."""
    handle = ModelHandle.resolve(exported(family))
    assert handle.manifest.num_layers == 2
    check_engine(create_engine("ort", handle), hf_reference(tiny_model(family), family), HF_MAX_ABS, family)
