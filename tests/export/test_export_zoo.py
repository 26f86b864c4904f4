"""Every common text architecture exports with every hidden state and its raw embeddings, matching plain
Hugging Face on every layer with left and right padding; its store and (decoders) its lens head work.

One tiny random checkpoint per model type (tests/tiny_zoo.py), exported once per module and shared by the
checks.  A few types (one per kind of path: an Optimum encoder, an Optimum decoder with scaled embeddings,
a torch.onnx mixture-of-experts decoder) run in the fast suite; the rest are ``slow``.
``scripts/coverage_table.py`` runs the same checks (``zoo_checks.py``) for docs/FAMILIES.md.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiny_zoo import MODEL_TYPES
from zoo_checks import (TEXTS, check_lens, check_manifest, check_store_tokens, export_zoo, hf_layers, lens_expected)

FAST = ("mpnet", "gemma", "mixtral")
CASES = [pytest.param(t, marks=() if t in FAST else pytest.mark.slow) for t in MODEL_TYPES]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    cache: dict[str, tuple] = {}

    def get(model_type: str):
        if model_type not in cache:
            root = tmp_path_factory.mktemp(f"zoo-{model_type}")
            cache[model_type] = export_zoo(model_type, root)
        return cache[model_type]

    return get


@pytest.mark.parametrize("model_type", CASES)
def test_export_has_every_layer_with_parity_recorded(model_type, zoo):
    """Catches: a hidden state or the raw embeddings missing from the graph, an output the parity check
    skipped or that differs from torch (a traced sliding window, an expert loop baked at trace time)."""
    ckpt, export = zoo(model_type)
    worst = check_manifest(model_type, export)
    assert worst <= 1e-4


@pytest.mark.parametrize("model_type", CASES)
def test_store_token_vectors_equal_hugging_face_left_and_right_padded(model_type, zoo, tmp_path):
    """Catches: any layer's token vectors (through ``extract --tokens`` on ONNX Runtime) that differ from a
    plain Hugging Face forward, padded on the right or on the left (positions from the mask, as
    ``generate`` gives them), e.g. wrong positions, a pad token attended to, Gemma's raw rows scaled."""
    ckpt, export = zoo(model_type)
    for side in ("right", "left"):
        ref = hf_layers(ckpt, model_type, TEXTS, side)
        if ref is None:
            assert side == "left" and model_type == "distilbert"  # its positions cannot be given: see zoo_checks
            continue
        worst = check_store_tokens(export, ref, tmp_path / f"store-{side}")
        assert worst <= 2e-5, (side, worst)


@pytest.mark.parametrize("model_type", [t for t in CASES if lens_expected(t.values[0])])
def test_lens_head_ranks_equal_the_models_own_logits(model_type, zoo):
    """Catches: a head found in the wrong place, its modules applied out of order (DistilBERT registers its
    activation first), a final norm applied twice or missed: the head kept in the export, applied to the
    last layer, must rank the vocabulary as the Hugging Face model's own logits do."""
    ckpt, export = zoo(model_type)
    check_lens(ckpt, export, model_type)


def test_gemma_raw_is_the_unscaled_rows_and_layer0_the_scaled_ones(zoo):
    """Catches: ``raw`` read through Gemma's scaling embedding module (then equal to layer 0), and a manifest
    that does not say what the two mean."""
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    ckpt, export = zoo("gemma")
    handle = ModelHandle.resolve(export)
    assert "sqrt(hidden_size)" in handle.manifest.raw["embedding_note"]
    engine = create_engine("ort", handle)
    batch = engine.encoder()(TEXTS)
    raw, layer0 = engine.run_tokens(batch, ["raw", "0"])
    valid = batch.mask.astype(bool)
    from safetensors.numpy import load_file

    table = next(v for k, v in load_file(str(ckpt / "model.safetensors")).items() if k.endswith("embed_tokens.weight"))
    np.testing.assert_array_equal(raw[valid], table[batch.input_ids[valid]])
    np.testing.assert_allclose(layer0[valid], raw[valid] * math.sqrt(handle.manifest.hidden_size), rtol=1e-6)


@pytest.mark.parametrize("model_type", ["mpnet", pytest.param("bloom", marks=pytest.mark.slow)])
def test_torch_and_openvino_token_vectors_equal_onnx_runtime(model_type, zoo):
    """Catches: an engine that cannot feed the graph (OpenVINO names BLOOM's mask input after the Cast that
    reads it, so the engine asked for an input called '/Cast_1_output_0') or that differs on any layer."""
    from layerscope.engines.base import create_engine
    from layerscope.model.handle import ModelHandle

    handle = ModelHandle.resolve(zoo(model_type)[1])
    ort = create_engine("ort", handle)
    batch = ort.encoder()(TEXTS)
    layers = list(handle.manifest.layers)
    ref = ort.run_tokens(batch, layers)
    valid = batch.mask.astype(bool)
    for name in ("torch", "ov"):
        got = create_engine(name, handle).run_tokens(batch, layers)
        for layer, a, b in zip(layers, got, ref):
            np.testing.assert_allclose(a[valid], b[valid], atol=1e-4, err_msg=f"{model_type} {name} layer {layer}")
